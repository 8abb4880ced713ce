"""Training processes for the SIGKILL crash test (tests/reliability/test_crash_sigkill.py), served by a fork
server.

Starting Python with torch takes seconds on a loaded machine, which would make a test of dozens
of kills take minutes. So this script imports torch and mltrace once and then forks one training
process per request; forking takes milliseconds, and the test kills each forked child with
SIGKILL at a moment it picks. Nothing runs threads before a fork (the writer thread starts in the
child), so fork is safe here.

Protocol, one JSON object per line (stdin -> stdout):
  {"run": OUT_DIR, "steps": N, "die_after": KEY or null}  -> {"pid": PID}
      forks a child that trains N steps into OUT_DIR with mltrace.pytorch.Hook and closes the
      hook; with ``die_after`` the child SIGKILLs itself right after the file KEY is in place
      (the test's way to hit one exact moment, e.g. between a step's events and index files).
  {"reap": PID}  -> {"pid": PID, "status": S}   waits for that child; S as Popen.returncode
A child is reaped only when the test asks, so its PID cannot be reused before the test's kill.

Every step saves, besides weights, biases, gradients (with reductions) and the loss, three values
that are functions of the step alone (``expected_custom``), so the test checks them exactly
without a reference run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

import numpy as np

SEED = 0
#: every 5th step is an EVAL step, the others TRAIN (so mode steps are checked too).
EVAL_EVERY = 5
#: elements of the "heavy" tensor: most steps 256 KiB, every 10th step (7, 17, ...) 4 MiB, so
#: that many kills land while a large file is being written.
HEAVY_SMALL, HEAVY_LARGE = 64 * 1024, 1024 * 1024
KILL_SCHEME = "crashtest"


def is_eval_step(step: int) -> bool:
    """Whether global step ``step`` runs in EVAL mode."""
    return step % EVAL_EVERY == EVAL_EVERY - 1


def expected_custom(step: int) -> dict[str, np.ndarray]:
    """The values the child saves with save_scalar / save_tensor at ``step``, by tensor name."""
    size = HEAVY_LARGE if step % 10 == 7 else HEAVY_SMALL
    heavy = np.arange(size, dtype=np.float32) * np.float32(1e-3) + np.float32(step)
    return {
        "scalar/step_code": np.array([step * 0.5 + 1.0]),
        "step_vector": np.array([step, step * step, -step, 7], dtype=np.int64),
        "heavy": heavy,
    }


def _train(out_dir: str, steps: int) -> None:
    """Train the seeded model for ``steps`` steps, saving every step."""
    import torch
    from torch import nn

    import mltrace.pytorch as smd
    from tests.support.torch_training import make_model

    model, loss_fn = make_model(SEED), nn.MSELoss()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["mean", "max"], norms=["l2"], save_raw_tensor=True)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234)
    for step in range(steps):
        x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)
        if is_eval_step(step):
            hook.set_mode(smd.modes.EVAL)
            with torch.no_grad():
                loss_fn(model(x), y)
        else:
            hook.set_mode(smd.modes.TRAIN)
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        custom = expected_custom(step)
        hook.save_scalar("step_code", float(custom["scalar/step_code"][0]))
        hook.save_tensor("step_vector", custom["step_vector"], "codes")
        hook.save_tensor("heavy", custom["heavy"], "heavy")
    hook.close()


def _register_kill_scheme() -> None:
    """``crashtest://PATH?KEY``: local storage at PATH whose process SIGKILLs itself right after
    writing KEY (fault injection on top of the real LocalStorage, never instead of it)."""
    from mltrace.storage import register_scheme
    from mltrace.storage.local import LocalStorage

    class _DyingStorage(LocalStorage):
        def __init__(self, uri: str) -> None:
            root, _, self.die_after = uri[len(KILL_SCHEME) + 3:].partition("?")
            super().__init__(root)

        def write(self, key: str, data: bytes) -> None:
            super().write(key, data)
            if key == self.die_after:
                os.kill(os.getpid(), signal.SIGKILL)

    register_scheme(KILL_SCHEME, _DyingStorage)


def _child(request: dict) -> None:
    """The forked child: train, then leave without running the server's cleanup."""
    code = 0
    try:
        out_dir = request["run"]
        if request.get("die_after"):
            out_dir = f"{KILL_SCHEME}://{out_dir}?{request['die_after']}"
        _train(out_dir, int(request["steps"]))
    except BaseException:  # report and exit non-zero; the test sees the status
        traceback.print_exc(file=sys.stderr)
        code = 1
    os._exit(code)


def _fork(request: dict) -> int:
    pid = os.fork()
    if pid == 0:
        _child(request)
    return pid


def _status(wait_status: int) -> int:
    """A waitpid status as Popen.returncode spells it (-9 for SIGKILL)."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _warm_up() -> None:
    """Do once, before any fork, what imports lazily on a first training step (the optimizer
    imports torch._dynamo: seconds), so that each child starts training at once."""
    import torch
    from torch import nn

    import mltrace.pytorch  # noqa: F401
    from tests.support.torch_training import make_model

    torch.set_num_threads(1)  # bitwise the same values in every child
    model = make_model(SEED)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    nn.MSELoss()(model(torch.zeros(2, 4)), torch.zeros(2, 1)).backward()
    opt.step()


def serve() -> None:
    """Answer requests until stdin closes."""
    _warm_up()
    _register_kill_scheme()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "run" in request:
            reply = {"pid": _fork(request)}
        else:
            pid = int(request["reap"])
            reply = {"pid": pid, "status": _status(os.waitpid(pid, 0)[1])}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
