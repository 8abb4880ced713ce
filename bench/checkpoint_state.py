"""What smdebug's checkpoint support costs per step: a PyTorch loop with no hook, with the
hook, and with the hook while a checkpoint configuration is set (the hook then looks at the
checkpoint folder at every step boundary, as smdebug's StateStore did), side by side in one process.

The job saves a checkpoint every ``--ckpt-every`` steps into a folder that already holds
``--files`` older checkpoints (jobs keep several), so each look walks that many files.

    .venv/bin/python bench/checkpoint_state.py --steps 300 --runs 5
    .venv-legacy/bin/python bench/checkpoint_state.py --lib smdebug      # smdebug's own, same loop

Protocol (bench/protocol.py): one thread, a warm-up run, ``--runs`` measured runs interleaved, the
median.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import shutil
import tempfile
import time

import torch

import protocol


def one_run(lib: str | None, checkpointing: bool, steps: int, ckpt_every: int, files: int,
            workdir: str) -> float:
    """ms/step of one run."""
    out_dir, ckpt_dir = tempfile.mkdtemp(dir=workdir), tempfile.mkdtemp(dir=workdir)
    config = os.path.join(workdir, "checkpointconfig.json")
    with open(config, "w") as f:
        json.dump({"LocalPath": ckpt_dir}, f)
    os.environ["CHECKPOINT_CONFIG_FILE_PATH"] = config if checkpointing else os.path.join(workdir, "none")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    for i in range(files):
        torch.save(model.state_dict(), os.path.join(ckpt_dir, f"old_{i}.pt"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = None
    if lib is not None:
        smd = importlib.import_module(f"{lib}.pytorch")
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=100),
                        include_collections=["losses"])
        hook.register_module(model)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    start = time.perf_counter()
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if (step + 1) % ckpt_every == 0:
            torch.save(model.state_dict(), os.path.join(ckpt_dir, f"ckpt_{step}.pt"))
    elapsed = time.perf_counter() - start
    if hook is not None:
        hook.close()
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return 1000 * elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default="mltrace", help="mltrace or smdebug")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--files", type=int, default=10, help="older checkpoints in the folder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    variants = {"no hook": (None, False), f"{args.lib} hook": (args.lib, False),
                f"{args.lib} hook + checkpoint config": (args.lib, True)}
    with tempfile.TemporaryDirectory() as workdir:
        times = protocol.interleaved(
            {name: functools.partial(one_run, lib, checkpointing, args.steps, args.ckpt_every,
                                     args.files, workdir)
             for name, (lib, checkpointing) in variants.items()}, args.runs)
    base = times["no hook"].median
    print(f"load average {protocol.load_average():.2f}; {args.steps} steps, checkpoint every "
          f"{args.ckpt_every}, {args.files} older checkpoints in the folder")
    for name, m in times.items():
        med = m.median
        print(f"{name:<40} {med:8.3f} ms/step  x{med / base:5.2f}  (+{med - base:.3f} ms)")


if __name__ == "__main__":
    main()
