"""A small FSDP2 job (``torch.distributed.fsdp.fully_shard``, gloo, CPU) saving with mltrace's
PyTorch hook, and the same training in one process, for tests/pytorch/test_pytorch_fsdp.py.

Every rank builds the same model (same seed) and shards each Linear and the root; the global
batch of each step is split evenly across ranks, so FSDP2's averaged gradient equals the
single-process gradient of the whole batch. The Linear layers have 16, 5 and 1 output rows: on
2 and 4 ranks their shards are uneven, and some ranks hold no row of the last one.

    python tests/support/fsdp_training.py OUT_DIR [--steps N] [--reductions-only] [--single]
        [--include-workers one|all] [--stability]

``--single`` trains in this one process without torch.distributed (the reference run).
``--stability`` trains with AdamW and saves the optimizer-side stability signals (grad norms,
updates, Adam's state) instead of the parameters. Each rank
writes the all-reduces mltrace issued in each step to ``OUT_DIR-collectives/rank<N>.json``.
Imports only the stdlib, torch, mltrace and tests/support/ddp_training.py (to end a rank).
"""

from __future__ import annotations

import argparse
import json
import os

STEPS, BATCH = 3, 8


def _model():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 5), nn.ReLU(), nn.Linear(5, 1))


def _batches(steps: int):  # type: ignore[no-untyped-def]
    import torch

    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 6, generator=gen), torch.randn(BATCH, 1, generator=gen))
            for _ in range(steps)]


def train(out_dir: str, steps: int, reductions_only: bool, single: bool,
          include_workers: str = "one", stability: bool = False) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import mltrace.pytorch as smd

    rank, world = 0, 1
    model = _model()
    if not single:
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    reduction_config = smd.ReductionConfig(
        reductions=["mean", "max", "min", "std"], abs_reductions=["max"], norms=["l2"],
        save_raw_tensor=False) if reductions_only else None
    collections = ["grad_norms", "updates", "optimizer_state", "losses"] if stability else \
        ["weights", "biases", "gradients", "losses"]
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=collections,
                    reduction_config=reduction_config, include_workers=include_workers)
    loss_fn = nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01) if stability else \
        torch.optim.SGD(model.parameters(), lr=0.1)
    rows = BATCH // world
    from mltrace.pytorch.sharded import collectives_issued, reset_bytes_moved

    per_step = []
    for x, y in _batches(steps):
        reset_bytes_moved()
        opt.zero_grad()
        part = slice(rank * rows, (rank + 1) * rows)
        loss_fn(model(x[part]), y[part]).backward()
        opt.step()
        per_step.append(collectives_issued())
    hook.close()
    os.makedirs(out_dir + "-collectives", exist_ok=True)
    with open(os.path.join(out_dir + "-collectives", f"rank{rank}.json"), "w") as f:
        json.dump(per_step, f)
    if not single:
        dist.barrier()  # no rank tears gloo down while another still talks to it
        dist.destroy_process_group()
        from tests.support.ddp_training import end_process

        end_process()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--reductions-only", action="store_true")
    parser.add_argument("--single", action="store_true")
    parser.add_argument("--include-workers", default="one", choices=["one", "all"])
    parser.add_argument("--stability", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    train(args.out_dir, args.steps, args.reductions_only, args.single, args.include_workers,
          args.stability)


if __name__ == "__main__":
    main()
