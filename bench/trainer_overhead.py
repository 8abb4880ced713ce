"""Time per optimizer step of Transformers' Trainer and Lightning's Trainer: no callback vs
mltrace's MltraceCallback saving nothing due (interval 1000: only step 0) and saving every step.

Runs in .venv, CPU, one thread. Models: a tiny BERT built from a config (hidden 32, 2 layers,
vocab 40, sequences of 16, batch 8, gradient accumulation 2) for Transformers; an MLP 32-64-1
(batch 64, accumulate_grad_batches 2) for Lightning. SGD, constant learning rate, no evaluation,
no checkpoints, no logger (Transformers: report_to none, logging every 10 steps). The callback
saves weights, biases, gradients, losses and the logged metrics.

Protocol (bench/protocol.py), side by side in one process: configurations interleaved round by
round (one warm-up round, then ``--runs`` measured rounds), medians reported. A run builds a
fresh model and trainer (not timed), then times ``train()``/``fit`` plus ``callback.close()``
(close waits for the background writer: deferred work is counted). Columns: ms/step (median
wall time per optimizer step), overhead (median over no callback's, minus 1), paired (median
over rounds of this run over the no-callback run of its round, minus 1), self (wall time per step
spent inside mltrace: its trainer events, model hooks and optimizer-step hook, outermost calls
only; what other processes' load moves least, on a shared machine).

Example:
    .venv/bin/python bench/trainer_overhead.py                        # about 3 minutes
    .venv/bin/python bench/trainer_overhead.py --only lightning --runs 3
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import mltrace  # noqa: E402

import protocol  # noqa: E402

COLLECTIONS = ["weights", "biases", "gradients", "losses", "metrics"]
CONFIGS = {"none": None, "interval 1000": 1000, "interval 1": 1}
_inside = {"seconds": 0.0, "depth": 0}


def _instrument() -> None:
    """Time the outermost calls into mltrace from the trainers (see the module doc: self)."""
    import mltrace.lightning as pl_cb
    import mltrace.transformers as hf_cb
    from mltrace.pytorch import optim

    def timed(cls: Any, name: str) -> None:
        fn = getattr(cls, name)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _inside["depth"]:
                return fn(*args, **kwargs)
            _inside["depth"] += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _inside["seconds"] += time.perf_counter() - start
                _inside["depth"] -= 1

        setattr(cls, name, wrapper)

    timed(optim.OptimizerSteps, "_post")
    for name in ("on_step_begin", "on_log", "on_train_end", "_before_forward", "_after_forward"):
        timed(hf_cb.MltraceCallback, name)
    for name in ("on_train_batch_start", "on_train_batch_end", "_logged", "on_fit_end"):
        timed(pl_cb.MltraceCallback, name)


def _callback(kind: str, interval: int | None, out_dir: str) -> Any:
    if interval is None:
        return None
    if kind == "transformers":
        from mltrace.transformers import MltraceCallback
    else:
        from mltrace.lightning import MltraceCallback  # type: ignore[assignment]
    return MltraceCallback(out_dir=out_dir, save_config=mltrace.SaveConfig(save_interval=interval),
                           include_collections=COLLECTIONS)


def run_transformers(steps: int, interval: int | None, work: str) -> float:
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=2))
    ids = torch.randint(0, 40, (steps * 16, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row[0] % 2} for row in ids]
    args = TrainingArguments(
        output_dir=os.path.join(work, "hf"), per_device_train_batch_size=8, gradient_accumulation_steps=2,
        max_steps=steps, logging_steps=10, optim="sgd", learning_rate=0.01, lr_scheduler_type="constant",
        report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    callback = _callback("transformers", interval, os.path.join(work, "trial"))
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback] if callback else [])
    trainer.remove_callback(PrinterCallback)  # no log lines in the table
    _inside["seconds"] = 0.0
    start = time.perf_counter()
    trainer.train()
    if callback is not None:
        callback.close()
    return (time.perf_counter() - start) / steps


def run_lightning(steps: int, interval: int | None, work: str) -> float:
    import lightning as L
    from torch import nn

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(steps * 2 * 64, 32, generator=gen)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64)
    callback = _callback("lightning", interval, os.path.join(work, "trial"))
    trainer = L.Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[callback] if callback else [],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=work, accelerator="cpu")
    model = MLP()
    _inside["seconds"] = 0.0
    start = time.perf_counter()
    trainer.fit(model, loader)
    if callback is not None:
        callback.close()
    return (time.perf_counter() - start) / steps


def measure(name: str, fn: Callable[[int, int | None, str], float], steps: int, runs: int) -> None:
    def run(interval: int | None) -> tuple[float, float]:  # (s/step, s/step inside mltrace)
        work = tempfile.mkdtemp(prefix="mltrace-trainer-bench-")
        try:
            per_step = fn(steps, interval, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return per_step, _inside["seconds"] / steps

    measured = protocol.interleaved(
        {config: functools.partial(run, interval) for config, interval in CONFIGS.items()}, runs)
    times, inside = protocol.pick(measured, 0), protocol.pick(measured, 1)
    base = times["none"].median
    print(f"\n{name}: {steps} optimizer steps, {runs} runs (median), load {protocol.load_average():.2f}")
    print(f"{'configuration':<16}{'ms/step':>10}{'overhead':>10}{'paired':>10}{'self ms':>10}{'self':>8}")
    for config in CONFIGS:
        med = times[config].median
        own = inside[config].median
        paired = protocol.median(r - 1 for r in protocol.paired(times, "none", config))
        print(f"{config:<16}{med * 1e3:>10.2f}{med / base - 1:>+10.1%}{paired:>+10.1%}"
              f"{own * 1e3:>10.3f}{own / (med - own):>+8.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("transformers", "lightning"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hf-steps", type=int, default=40)
    parser.add_argument("--pl-steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    print(f"commit {protocol.commit()}")
    _instrument()
    if args.only in (None, "transformers"):
        measure("Transformers Trainer (tiny BERT, accumulation 2)", run_transformers, args.hf_steps, args.runs)
    if args.only in (None, "lightning"):
        measure("Lightning Trainer (MLP, accumulate_grad_batches 2)", run_lightning, args.pl_steps, args.runs)


if __name__ == "__main__":
    main()
