"""TensorBoard histogram export: mltrace's hook vs torch's SummaryWriter.add_histogram, same work.

Every step of a small PyTorch training loop, the histogram of every weight and every gradient goes
to a TensorBoard events file, by:

  none      the training loop alone
  torch     ``SummaryWriter.add_histogram(name, tensor, step)`` for each weight and gradient after
            ``backward()`` (binning on the training thread, TF's default buckets)
  mltrace   ``mltrace.pytorch.Hook(export_tensorboard=True)`` saving the weights and gradients
            collections every step as one ``mean`` reduction each (so the trial part stays small)
            and exporting their histograms (same buckets, binned on the writer's thread)
  mltrace_noexport  the same hook without the export (what the export itself adds)

Protocol (bench/protocol.py): torch.set_num_threads(1), one warm-up then ``--runs``
measured runs of every variant interleaved in one process, medians reported. A run's time covers
the training loop and ``close()`` (all summaries on disk), measured as wall time; the training
thread's own time (until the last step returns) is reported too.

    .venv/bin/python bench/tb_export_overhead.py [--steps 200] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import protocol  # noqa: E402

VARIANTS = ("none", "torch", "mltrace", "mltrace_noexport")


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def run(variant: str, steps: int, workdir: str) -> dict[str, float]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    out = tempfile.mkdtemp(dir=workdir)
    writer = hook = None
    if variant == "torch":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.path.join(out, "tb"))
    elif variant.startswith("mltrace"):
        import mltrace.pytorch as smd

        hook = smd.Hook(out_dir=os.path.join(out, "trial"), export_tensorboard=variant == "mltrace",
                        save_config=smd.SaveConfig(save_interval=1), include_collections=["weights", "gradients"],
                        reduction_config=smd.ReductionConfig(reductions=["mean"]))
        hook.register_module(model)
    start = time.perf_counter()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if writer is not None:
            for name, p in model.named_parameters():
                writer.add_histogram(f"weights/{name}", p, step)
                writer.add_histogram(f"gradients/{name}", p.grad, step)
        opt.step()
    loop = time.perf_counter() - start
    if writer is not None:
        writer.close()
    if hook is not None:
        hook.close()
    total = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    return {"loop_s": loop, "total_s": total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    machine = protocol.machine()
    workdir = tempfile.mkdtemp(prefix="mltrace-bench-tb-")
    try:
        measured = protocol.interleaved(
            {v: functools.partial(run, v, args.steps, workdir) for v in VARIANTS}, args.runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results = {v: m.runs for v, m in measured.items()}
    figures = {k: protocol.pick(measured, k) for k in ("loop_s", "total_s")}
    med = {v: {k: figures[k][v].median for k in figures} for v in VARIANTS}
    base = med["none"]["total_s"]
    n_hist = 2 * len(list(make_model().parameters()))
    rows = []
    for v in VARIANTS:
        m = med[v]
        rows.append({"variant": v, "ms_per_step": 1000 * m["total_s"] / args.steps,
                     "loop_ms_per_step": 1000 * m["loop_s"] / args.steps,
                     "export_ms_per_step": 1000 * (m["total_s"] - base) / args.steps,
                     "vs_torch_export": ((m["total_s"] - base) / (med["torch"]["total_s"] - base)) if v != "none" else None})
    report = {"steps": args.steps, "runs": args.runs, "histograms_per_step": n_hist, "rows": rows, "raw": results,
              "loadavg": protocol.load_average(), "machine": machine}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{args.steps} steps, {n_hist} histograms/step (MLP 256-512-256-10 weights+gradients), "
          f"median of {args.runs} runs, load {protocol.load_average():.2f}, commit {machine['commit']}")
    print(f"{'variant':18} {'ms/step':>9} {'loop ms/step':>13} {'added ms/step':>14} {'vs torch':>9}")
    for r in rows:
        ratio = "" if r["vs_torch_export"] is None else f"{r['vs_torch_export']:.2f}"
        print(f"{r['variant']:18} {r['ms_per_step']:9.2f} {r['loop_ms_per_step']:13.2f} "
              f"{r['export_ms_per_step']:14.2f} {ratio:>9}")
    print("added = (variant - none); vs torch = added / torch's added. 'loop' stops when the last step "
          "returns (before close): what the training thread waits for.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
