"""A PyTorch job that checkpoints, may be preempted, and resumes from its newest checkpoint: the
process behind the checkpoint-state tests (tests/porting/test_porting_hooks.py and, with real smdebug
1.0.34 writing or resuming one of the runs, tests/legacy/test_smdebug_porting_hooks.py).

Usage: python resume_training.py OUT_DIR CKPT_DIR LIB STEPS [DIE_AT]
  LIB is ``mltrace`` or ``smdebug`` (whose ``pytorch`` module the hook comes from). The job trains
  a linear model for STEPS training steps in all, starting after the newest ``ckpt_<i>.pt`` in
  CKPT_DIR if there is one, and saves a checkpoint every CKPT_EVERY steps under a new name (as
  jobs that keep several do). With DIE_AT it ends itself with ``os._exit`` right after that
  step's forward pass, as a preempted instance stops: no close, no atexit (mltrace's hook first
  waits for its files, see below). The environment names
  the checkpoint configuration file (CHECKPOINT_CONFIG_FILE_PATH).
"""

from __future__ import annotations

import glob
import importlib
import os
import sys

import numpy as np
import torch

CKPT_EVERY = 4


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of training step ``i`` (a function of ``i`` alone)."""
    rng = np.random.default_rng(100 + i)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(x.sum(1, keepdims=True))


def main(out_dir: str, ckpt_dir: str, lib: str, steps: int, die_at: int | None) -> None:
    smd = importlib.import_module(f"{lib}.pytorch")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.MSELoss()
    start = 0
    found = sorted(glob.glob(os.path.join(ckpt_dir, "ckpt_*.pt")),
                   key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    if found:
        state = torch.load(found[-1])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["next"]
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    for i in range(start, steps):
        x, y = batch(i)
        loss = loss_fn(model(x), y)
        if i == die_at:
            if hasattr(hook, "flush"):
                # mltrace writes files on a background thread, and a hard exit loses what it had
                # not written yet (tests/reliability/test_crash_sigkill.py); smdebug wrote each step on the
                # training thread. Dying once the files are stored keeps the comparison exact.
                hook.flush()
            os._exit(0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if (i + 1) % CKPT_EVERY == 0:
            os.makedirs(ckpt_dir, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "next": i + 1},
                       os.path.join(ckpt_dir, f"ckpt_{i}.pt"))
    hook.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
         int(sys.argv[5]) if len(sys.argv) > 5 else None)
