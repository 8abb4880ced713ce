"""A small DistributedDataParallel job (gloo, CPU, several processes on this machine) that saves
with mltrace's PyTorch hook and records what each rank computed, for multi-worker trial tests.

``run_job(...)`` starts one process per rank, as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT in the environment), and returns what each rank captured. Each process runs this
file as a script::

    python tests/support/ddp_training.py OUT_DIR CAPTURE.npz [--steps N] [--include-workers all|one]
        [--register module|ddp]

Every rank trains the same tiny model (DDP broadcasts rank 0's parameters) on data of its own
(seeded by rank), so weights agree across workers while inputs, losses and local gradients do
not. The hook saves weights, biases, gradients, the loss and the model's input every step. The
capture file holds, per "<tensor name>|<step>", the value the rank saw: parameters before the
step's update, each parameter's local gradient as the gradient hook receives it (before DDP
averages it across ranks, as smdebug's hook also saves it), the loss and the input; plus
``averaged|<name>|<step>`` (the gradient after DDP's all-reduce) and ``meta`` (JSON: the
hook's worker name and num_workers).

Imports only the stdlib, numpy, torch and mltrace: it also runs in .venv-legacy.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
ROOT = "Net"  # the registered module's class name: tensor names start with it


@dataclass
class WorkerCapture:
    """What one rank computed: values by "<name>|<step>", and the hook's identity."""

    rank: int
    values: dict[str, np.ndarray]
    worker: str
    num_workers: int

    def get(self, name: str, step: int) -> np.ndarray:
        return self.values[f"{name}|{step}"]

    def averaged_gradient(self, name: str, step: int) -> np.ndarray:
        return self.values[f"averaged|{name}|{step}"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(out_dir: str, capture_dir: str, world_size: int, steps: int = 3,
            include_workers: str = "all", register: str = "module",
            env: dict[str, str] | None = None, python: str = sys.executable,
            timeout: float = 120.0) -> list[WorkerCapture]:
    """Run the job with ``world_size`` processes and return each rank's capture, by rank.

    Raises:
        RuntimeError: a rank failed or the job ran past ``timeout`` (its output is in the message).
    """
    launch_ranks(
        lambda rank: [python, HERE, out_dir, os.path.join(capture_dir, f"rank{rank}.npz"),
                      "--steps", str(steps), "--include-workers", include_workers,
                      "--register", register],
        world_size, capture_dir, env, timeout)
    return [_load(os.path.join(capture_dir, f"rank{r}.npz"), r) for r in range(world_size)]


def launch_ranks(command: Callable[[int], list[str]], world_size: int, log_dir: str,
                 env: dict[str, str] | None = None, timeout: float = 120.0) -> None:
    """Run ``command(rank)`` for every rank at once, as torchrun would (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT on loopback), each logging to ``log_dir/rank<r>.log``.

    Raises:
        RuntimeError: a rank failed or ran past ``timeout`` (the failed ranks' output is in the
            message); every process started here has ended by then.
    """
    os.makedirs(log_dir, exist_ok=True)
    base = dict(os.environ if env is None else env)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size),
                OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
                    p for p in (REPO, base.get("PYTHONPATH", "")) if p))
    if os.path.exists("/sys/class/net/lo"):  # gloo's own connections on loopback too
        base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = []
    for rank in range(world_size):
        log = open(os.path.join(log_dir, f"rank{rank}.log"), "wb")
        procs.append((subprocess.Popen(command(rank), env=dict(base, RANK=str(rank)), stdout=log,
                                       stderr=subprocess.STDOUT), log))
    failed = []
    try:
        for rank, (proc, log) in enumerate(procs):
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                failed.append(rank)
            log.close()
            if proc.returncode:
                failed.append(rank)
    finally:
        for proc, _ in procs:  # only the processes started here, by their handles
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed:
        logs = "\n".join(f"--- rank {r} ---\n" + _tail(os.path.join(log_dir, f"rank{r}.log"))
                         for r in sorted(set(failed)))
        raise RuntimeError(f"ranks {sorted(set(failed))} of the job failed:\n{logs}")


def end_process() -> None:
    """End a rank's process once its work is written and its process group destroyed, without
    interpreter teardown: at teardown gloo's C++ worker threads can abort the process
    ("terminate called without an active exception", pytorch/pytorch#190489), one rank in
    dozens of runs on a loaded machine, after the job itself has finished."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _tail(path: str, n: int = 4000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def _load(path: str, rank: int) -> WorkerCapture:
    with np.load(path) as data:
        values = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    return WorkerCapture(rank, values, meta["worker"], meta["num_workers"])


def _train(out_dir: str, capture: str, steps: int, include_workers: str, register: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import mltrace.pytorch as smd

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env:// rendezvous on MASTER_ADDR:MASTER_PORT
    rank = dist.get_rank()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(4, 3)
            self.relu = nn.ReLU()
            self.fc2 = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.relu(self.fc1(x)))

    torch.manual_seed(100 + rank)  # ranks start apart; DDP makes them equal to rank 0
    model = Net()
    ddp = DistributedDataParallel(model)
    loss_fn = nn.MSELoss()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses", "model_input"],
                    include_workers=include_workers)
    registered = model if register == "module" else ddp
    hook.register_module(registered)
    hook.register_loss(loss_fn)
    hook.get_collection("model_input").add_module_tensors(registered, inputs=True, outputs=False)
    root = ROOT if register == "module" else "DistributedDataParallel"
    prefix = "" if register == "module" else "module."

    values: dict[str, np.ndarray] = {}
    step = 0
    for pname, param in model.named_parameters():
        def grab(grad: torch.Tensor, pname: str = pname) -> None:
            values[f"gradient/{root}_{prefix}{pname}|{step}"] = grad.detach().clone().numpy()
        param.register_hook(grab)

    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(steps):
        x = torch.randn(5, 4, generator=data)
        y = torch.randn(5, 1, generator=data)
        for pname, param in model.named_parameters():
            values[f"{root}_{prefix}{pname}|{step}"] = param.detach().clone().numpy()
        values[f"{root}_input_0|{step}"] = x.clone().numpy()
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        values[f"MSELoss_output_0|{step}"] = loss.detach().clone().numpy()
        for pname, param in model.named_parameters():
            averaged = param.grad.detach().clone().numpy()
            values[f"averaged|gradient/{root}_{prefix}{pname}|{step}"] = averaged
        opt.step()
    hook.close()
    meta = json.dumps({"worker": hook.worker, "num_workers": hook.num_workers})
    np.savez(capture, meta=np.array(meta), **values)
    dist.barrier()
    dist.destroy_process_group()
    end_process()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("capture")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--include-workers", default="all", choices=["all", "one"])
    parser.add_argument("--register", default="module", choices=["module", "ddp"])
    args = parser.parse_args(argv)
    _train(args.out_dir, args.capture, args.steps, args.include_workers, args.register)


if __name__ == "__main__":
    main()
