"""Cost of mltrace's PyTorch hook on FSDP2 training (``fully_shard``, gloo, CPU, several processes).

Three configurations run side by side in the same processes, on the same model and data, their
runs interleaved round by round (warm-up round, then ``--runs`` measured rounds):

* ``none``: no hook;
* ``reductions``: ``mltrace.pytorch.Hook`` saving every gradient every step as reductions only
  (mean, l2 norm and nan_count, ``save_raw_tensor=False``): each rank reduces its own shard and
  the partials are combined with a float64 all-reduce, the gradient is never gathered;
* ``raw``: the same hook saving the raw gradients (``save_raw_tensor=True``, no reductions):
  every gradient is gathered, shard by shard, to rank 0, which writes it.

Workload: an MLP of ``--layers`` (8) ``Linear(512, 512)`` with ReLU between them, each Linear
``fully_shard``-ed and then the root, MSE loss, SGD (lr 0.01), batch 32 per rank (each rank its
own fixed batches, generated before timing), ``--steps`` (30) steps per run, ``--world`` (2)
processes launched here with gloo on loopback (``launch_ranks`` of bench/_support.py), one torch
thread each. A hook is created on every rank after ``fully_shard`` and before
``register_module`` (as tests/support/fsdp_training.py does); ``include_workers="one"``: rank 0 writes.

A run is: fresh sharded model, optimizer and hook on a fresh ``out_dir``, a barrier, then the
timed region: ``--steps`` training steps plus ``hook.close()`` (which waits for deferred
writing). Its time is the slowest rank's (FSDP2's collectives keep ranks in step anyway).
Trials are deleted after each run, outside the timed region. Columns:

* **ms/step**: median over measured runs of (timed region / steps);
* **step p50**: median of the individual step times (close() excluded) of all measured runs;
* **added**: ms/step minus the no-hook ms/step of the same process;
* **mltrace B/step**: bytes all ranks together sent for mltrace's own gathers and all-reduces
  (``mltrace.pytorch.sharded.bytes_moved``, summed over ranks with an all-reduce), per step;
* **FSDP2 B/step (est.)**: FSDP2's own traffic for scale, counted the same point-to-point way:
  parameter bytes x (world - 1) x 3 (all-gather in forward, again in backward, reduce-scatter of
  the gradients); an estimate from the parameter count, not a measurement.

The warm-up run of each hook configuration is opened with ``create_trial`` afterwards (untimed)
to check that every gradient was saved at every step. Both the table (markdown) and every raw
run go to ``bench/results/pytorch_fsdp.json``; the load average is printed at start and end.

    .venv/bin/python bench/pytorch_fsdp.py                     # 2 ranks, 30 steps, 3 runs
    .venv/bin/python bench/pytorch_fsdp.py --world 4 --steps 20 --runs 3

With ``--worker`` the script is one rank of the job (the launcher passes it; RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT come from the environment).
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
from typing import Any

import protocol

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")  # log lines are not what is measured

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

CONFIGS = ("none", "reductions", "raw")
WIDTH, BATCH, LR = 512, 32, 0.01
REDUCTIONS = ["mean", "nan_count"]
NORMS = ["l2"]
DEFAULT_RESULTS = os.path.join(REPO, "bench", "results", "pytorch_fsdp.json")


# -- one rank -------------------------------------------------------------------------------------
def make_model(layers: int) -> Any:
    """The MLP, the same on every rank (same seed), each Linear and then the root sharded."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    modules: list[nn.Module] = []
    for i in range(layers):
        modules.append(nn.Linear(WIDTH, WIDTH))
        if i < layers - 1:
            modules.append(nn.ReLU())
    model = nn.Sequential(*modules)
    for module in model:
        if isinstance(module, nn.Linear):
            fully_shard(module)
    fully_shard(model)
    return model


def make_data(steps: int, rank: int) -> list[tuple[Any, Any]]:
    """This rank's fixed batches, one per step (data generation is not part of a step)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen))
            for _ in range(steps)]


def make_hook(config: str, out_dir: str, model: Any) -> Any:
    """The hook of ``config`` registered on the (already sharded) model; None for ``none``."""
    if config == "none":
        return None
    import mltrace.pytorch as smd

    if config == "reductions":
        reduction_config = smd.ReductionConfig(reductions=REDUCTIONS, norms=NORMS,
                                               save_raw_tensor=False)
    else:
        reduction_config = smd.ReductionConfig(save_raw_tensor=True)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients"], reduction_config=reduction_config,
                    include_workers="one")
    hook.register_module(model)
    return hook


def one_run(config: str, out_dir: str, layers: int, data: list[tuple[Any, Any]]) -> dict[str, Any]:
    """One run of ``config`` on every rank; returns this rank's wall and CPU time, each step's
    time, and the bytes all ranks sent for mltrace (summed over ranks)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from mltrace.pytorch.sharded import bytes_moved, reset_bytes_moved

    model = make_model(layers)
    hook = make_hook(config, out_dir, model)
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    reset_bytes_moved()
    dist.barrier()
    step_ms: list[float] = []
    cpu_start = time.process_time()
    start = time.perf_counter()
    for x, y in data:
        began = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        step_ms.append((time.perf_counter() - began) * 1000.0)
    if hook is not None:
        hook.close()
    elapsed_ms = (time.perf_counter() - start) * 1000.0
    cpu_ms = (time.process_time() - cpu_start) * 1000.0
    totals = torch.tensor([float(bytes_moved()), elapsed_ms], dtype=torch.float64)
    moved = totals[:1].clone()
    dist.all_reduce(moved, op=dist.ReduceOp.SUM)
    slowest = totals[1:].clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"ms": float(slowest.item()), "rank_ms": elapsed_ms, "cpu_ms": cpu_ms,
            "step_ms": step_ms, "bytes_moved": int(moved.item())}


def check_trial(out_dir: str, config: str, steps: int, layers: int) -> dict[str, Any]:
    """What the trial holds: gradient names, and whether each was saved at every step in the
    form the configuration asked for (raw values, or each reduction)."""
    from mltrace.trials import create_trial

    trial = create_trial(out_dir)
    names = sorted(trial.tensor_names(collection="gradients"))
    all_steps = list(range(steps))
    complete = len(names) == 2 * layers
    first = trial.tensor(names[0]) if names else None
    wanted = {(r, False) for r in REDUCTIONS + NORMS}
    for name in names:
        tensor = trial.tensor(name)
        complete &= tensor.steps() == all_steps
        if config == "raw":
            complete &= tensor.value_steps() == all_steps
        else:  # reductions only: no raw value, every reduction at every step
            complete &= not tensor.value_steps() and all(
                set(tensor.reduction_values(s)) == wanted for s in all_steps)
    sample: dict[str, Any] = {}
    if first is not None:
        if config == "raw":
            sample = {"name": names[0], "shape": list(first.value(all_steps[-1]).shape)}
        else:
            sample = {"name": names[0], **{r: float(first.reduction_value(all_steps[-1], r))
                                          for r in REDUCTIONS + NORMS}}
    return {"gradients": len(names), "complete": bool(complete), "sample": sample}


def worker(args: argparse.Namespace) -> None:
    """One rank: every round runs each configuration once; rank 0 writes the results."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = make_data(args.steps, rank)
    checks: dict[str, Any] = {}
    done = dict.fromkeys(CONFIGS, 0)  # runs made of each configuration; the first warms up

    def run(config: str) -> dict[str, Any]:
        out_dir = os.path.join(args.workdir, f"{config}_{done[config]}")
        result = one_run(config, out_dir, args.layers, data)
        if done[config] == 0 and config != "none" and rank == 0:
            checks[config] = check_trial(out_dir, config, args.steps, args.layers)
        done[config] += 1
        dist.barrier()  # every rank is done with the trial before it goes
        if rank == 0:
            shutil.rmtree(out_dir, ignore_errors=True)
        return result

    measured = protocol.interleaved({c: functools.partial(run, c) for c in CONFIGS}, args.runs)
    runs = {c: m.runs for c, m in measured.items()}
    warmup = {c: m.warmup for c, m in measured.items()}
    n_params = sum(p.numel() for p in make_model(args.layers).parameters())
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"world": world, "params": n_params, "runs": runs, "warmup": warmup,
                       "checks": checks, "torch": torch.__version__}, f)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


# -- the launcher ---------------------------------------------------------------------------------
def summarize(raw: dict[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """Per configuration: medians, added ms over no hook, bytes per step."""
    out: dict[str, dict[str, Any]] = {}
    for config in CONFIGS:
        runs = raw["runs"][config]
        ms = protocol.median(r["ms"] for r in runs) / steps
        out[config] = {
            "ms_per_step": ms,
            "step_p50_ms": protocol.median(s for r in runs for s in r["step_ms"]),
            "cpu_ms_per_step_rank0": protocol.median(r["cpu_ms"] for r in runs) / steps,
            "mltrace_bytes_per_step": protocol.median(r["bytes_moved"] for r in runs) / steps,
            "runs_ms_per_step": [r["ms"] / steps for r in runs],
        }
    for config in CONFIGS:
        out[config]["added_ms_per_step"] = out[config]["ms_per_step"] - out["none"]["ms_per_step"]
        out[config]["added_step_p50_ms"] = (out[config]["step_p50_ms"]
                                            - out["none"]["step_p50_ms"])
    return out


def table(summary: dict[str, dict[str, Any]], fsdp_bytes: float) -> str:
    rows = ["| config | ms/step | added | step p50 | added p50 | cpu ms/step (rank 0) "
            "| mltrace B/step | FSDP2 B/step (est.) |",
            "|---|---|---|---|---|---|---|---|"]
    for config, s in summary.items():
        added = "" if config == "none" else f"{s['added_ms_per_step']:+.2f}"
        added_p50 = "" if config == "none" else f"{s['added_step_p50_ms']:+.2f}"
        rows.append(f"| {config} | {s['ms_per_step']:.2f} | {added} | {s['step_p50_ms']:.2f} "
                    f"| {added_p50} | {s['cpu_ms_per_step_rank0']:.2f} "
                    f"| {s['mltrace_bytes_per_step']:,.0f} | {fsdp_bytes:,.0f} |")
    return "\n".join(rows)


def launch(args: argparse.Namespace) -> int:
    from _support import launch_ranks

    protocol.warn_if_busy()
    machine = protocol.machine()
    load_start = protocol.load_average()
    workdir = tempfile.mkdtemp(prefix="mltrace-bench-fsdp-")
    result_path = os.path.join(workdir, "result.json")
    try:
        began = time.perf_counter()
        launch_ranks(lambda rank: [sys.executable, HERE, "--worker", "--steps", str(args.steps),
                                   "--runs", str(args.runs), "--layers", str(args.layers),
                                   "--workdir", workdir, "--result", result_path],
                     args.world, os.path.join(workdir, "logs"), timeout=args.timeout)
        wall_s = time.perf_counter() - began
        with open(result_path) as f:
            raw = json.load(f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_end = protocol.load_average()

    summary = summarize(raw, args.steps)
    param_bytes = raw["params"] * 4
    fsdp_bytes = 3.0 * param_bytes * (args.world - 1)
    red, full = (summary[c]["mltrace_bytes_per_step"] for c in ("reductions", "raw"))
    text = table(summary, fsdp_bytes)
    print(f"FSDP2 (fully_shard, gloo, CPU): {args.world} ranks, {args.layers} x Linear({WIDTH}, "
          f"{WIDTH}) ({raw['params']:,} parameters, {param_bytes:,} B), batch {BATCH}/rank, "
          f"{args.steps} steps, 1 warm-up + {args.runs} measured runs, medians")
    print(f"load average {load_start:.2f} -> {load_end:.2f}; job wall time {wall_s:.0f} s; "
          f"commit {machine['commit']}\n")
    print(text)
    print(f"\nmltrace bytes/step raw / reductions: {full / red:,.0f}x" if red else "")
    for config, check in raw["checks"].items():
        print(f"trial check ({config}, warm-up run): {check['gradients']} gradients, "
              f"every step saved: {check['complete']}; {check['sample']}")

    report = {
        "world": args.world, "layers": args.layers, "width": WIDTH, "batch_per_rank": BATCH,
        "steps": args.steps, "runs": args.runs, "params": raw["params"],
        "param_bytes": param_bytes, "fsdp_bytes_per_step_estimate": fsdp_bytes,
        "reductions": REDUCTIONS, "norms": NORMS, "summary": summary,
        "raw_to_reductions_bytes_ratio": full / red if red else None,
        "table": text, "checks": raw["checks"], "runs_raw": raw["runs"],
        "warmup": raw["warmup"], "load_average": {"start": load_start, "end": load_end},
        "wall_s": wall_s,
        "env": {"python": machine["python"], "torch": raw["torch"],
                "cpu_count": machine["cores"]},
        "machine": machine,
    }
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.results}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3, help="measured runs (after one warm-up)")
    parser.add_argument("--world", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--layers", type=int, default=8, help="Linear(512, 512) layers")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole job")
    parser.add_argument("--results", default=DEFAULT_RESULTS, help="JSON output")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.runs < 1 or args.world < 2 or args.layers < 1:
        parser.error("--steps, --runs, --layers must be >= 1 and --world >= 2")
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
