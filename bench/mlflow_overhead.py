"""Training-loop overhead of logging to MLflow at every step: the mltrace hook without and with
``mlflow=...``, on a small CNN whose step takes about 5 ms on one CPU thread.

Model: Conv(1->8,3) ReLU MaxPool Conv(8->16,3) ReLU MaxPool Linear(400->10), cross-entropy, SGD,
batch ``--batch`` of 1x28x28 images, CPU, ``torch.set_num_threads(1)``. Both variants run the
same hook (collections weights and losses saved every step) and call ``hook.save_scalar("accuracy",
...)`` every step; the MLflow variant also sends the loss and the accuracy to MLflow at every step
(2 metrics per step) into a SQLite store in a temporary folder (``--tracking-uri`` for another).

Protocol (bench/protocol.py): one process, one training thread; the variants' runs are
interleaved (warm-up of each, then measured run k of each in turn); one warm-up and ``--runs``
measured runs; the median is reported. A run: fresh model, fresh hook on a fresh out_dir (and,
with MLflow, a new MLflow run: created in the hook's constructor, not timed), ``--steps`` steps.
Reported: ``loop`` = the training loop alone (what the target, < 5 % over the hook without
MLflow, is about), ``CPU`` = this process's CPU time in the loop, all threads (the helper
process's is not in it), and ``close`` = ``hook.close()`` (with MLflow: waiting for the last
batches, params, artifacts, the summary; once per job). Variants: ``hook+mlflow`` (default
sink: metrics logged by a helper process) and ``hook+mlflow-thread`` (``logging_process=False``:
MLflow's client in the sink's background thread, competing for the GIL). CPU time per step is
also split (Linux /proc) into the training thread, the sink's thread and the helper process:
wall-clock times on a shared VM vary by 10-20 % from run to run, CPU time shows where MLflow's
work goes whatever the machine's load. Ratios: of the medians
(the protocol), and the median over rounds k of run k / hook's run k (runs of one round follow
each other within seconds, so this one resists load that other processes put on the machine).

Example:
    .venv/bin/python bench/mlflow_overhead.py            # ~1-2 minutes on 2 cores
    .venv/bin/python bench/mlflow_overhead.py --steps 400 --runs 5 --json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no outbound requests from MLflow
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import protocol  # noqa: E402

#: hook: no MLflow; hook+mlflow: the default (metrics sent from a helper process);
#: hook+mlflow-thread: logging_process=False (MLflow's client runs in the sink's thread).
VARIANTS = ("hook", "hook+mlflow", "hook+mlflow-thread")
COLLECTIONS = ["weights", "losses"]
SINK_OPTIONS: dict[str, Any] = {}  # --flush-interval


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 10),
    )


def make_data(steps: int, batch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 28, 28, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(steps)]


def _cpu_seconds(pid: int, tid: int | None = None) -> float | None:
    """CPU seconds (user + system) of a process or one of its threads, from /proc (Linux)."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def one_run(variant: str | None, out_dir: str | None, data: list, experiment: str) -> tuple[float, ...]:
    """(loop ms per step, close ms, process CPU ms/step, training-thread CPU ms/step, sink-thread
    CPU ms/step, helper-process CPU ms/step) of one run; ``variant`` None runs without a hook.
    The last two are NaN where there is no such thread/process or no /proc."""
    import mltrace.pytorch as smd

    model = make_model()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = None
    if variant is not None:
        options = None
        if variant.startswith("hook+mlflow"):
            options = {"experiment": experiment, "logging_process": variant == "hook+mlflow", **SINK_OPTIONS}
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=list(COLLECTIONS), mlflow=options)
        hook.register_module(model)
        hook.register_loss(loss_fn)
    gc.collect()
    sink_tid = helper = None
    if hook is not None and hook.sinks:  # let the helper process start (MLflow import) untimed
        sink = hook.sinks[0]
        getattr(sink._transport, "wait_ready", lambda: None)()
        sink_tid = sink._thread.native_id
        helper = getattr(sink._transport, "pid", None)
    extra = [(os.getpid(), sink_tid), (helper, None)]
    extra_before = [_cpu_seconds(p, t) if p and (t or p != os.getpid()) else None for p, t in extra]
    cpu = time.process_time()
    thread_cpu = time.thread_time()
    start = time.perf_counter()
    for x, y in data:
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        if hook is not None:
            hook.save_scalar("accuracy", (out.argmax(1) == y).float().mean().item())
    loop = time.perf_counter() - start
    thread_cpu = time.thread_time() - thread_cpu
    cpu = time.process_time() - cpu
    extra_after = [_cpu_seconds(p, t) if p and (t or p != os.getpid()) else None for p, t in extra]
    extra_ms = [(a - b) * 1000.0 / len(data) if a is not None and b is not None else float("nan")
                for a, b in zip(extra_after, extra_before)]
    start = time.perf_counter()
    if hook is not None:
        hook.close()
    close = time.perf_counter() - start
    return (loop * 1000.0 / len(data), close * 1000.0, cpu * 1000.0 / len(data),
            thread_cpu * 1000.0 / len(data), *extra_ms)


def benchmark(steps: int, runs: int, batch: int, workdir: str, with_none: bool,
              names: list[str]) -> dict[str, Any]:
    data = make_data(steps, batch)
    variants: list[str | None] = ([None] if with_none else []) + names
    counter = 0

    def timed(variant: str | None) -> tuple[float, ...]:
        nonlocal counter
        counter += 1
        out_dir = os.path.join(workdir, f"trial_{counter}") if variant else None
        try:
            return one_run(variant, out_dir, data, "mltrace-bench")
        finally:
            if out_dir:
                shutil.rmtree(out_dir, ignore_errors=True)

    measured = protocol.interleaved({v or "none": functools.partial(timed, v) for v in variants},
                                    runs)
    # one_run's figures: loop, close, process CPU, training thread, sink thread, helper process
    loop, close, cpu, training, sink, helper = (protocol.pick(measured, i) for i in range(6))
    results = {}
    for v in measured:
        results[v] = {
            "loop_ms_per_step": loop[v].median, "close_ms": close[v].median,
            "cpu_ms_per_step": cpu[v].median,
            "training_thread_cpu_ms_per_step": training[v].median,
            "sink_thread_cpu_ms_per_step": sink[v].median,
            "helper_process_cpu_ms_per_step": helper[v].median,
            "runs_loop_ms_per_step": loop[v].runs, "runs_close_ms": close[v].runs,
            "runs_cpu_ms_per_step": cpu[v].runs, "warmup_loop_ms_per_step": loop[v].warmup}
    base = results["hook"]
    ratios = {}
    for v in names:
        if v != "hook":
            r = results[v]
            ratios[v] = {"loop": r["loop_ms_per_step"] / base["loop_ms_per_step"],
                         "loop_paired_median": protocol.median(protocol.paired(loop, "hook", v)),
                         "loop_plus_close": (r["loop_ms_per_step"] * steps + r["close_ms"])
                         / (base["loop_ms_per_step"] * steps + base["close_ms"]),
                         "process_cpu": r["cpu_ms_per_step"] / base["cpu_ms_per_step"]}
    return {"variants": results, "ratios_vs_hook": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5, help="measured runs per variant (after one warm-up)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tracking-uri", default=None, help="default: SQLite in a temporary folder")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without any hook")
    parser.add_argument("--flush-interval", type=float, default=None, help="the sink's (default: its own, 5 s)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma list among {', '.join(VARIANTS)} (hook is always included)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)
    names = ["hook"] + [v.strip() for v in args.variants.split(",") if v.strip() and v.strip() != "hook"]
    for v in names:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    if args.flush_interval:
        SINK_OPTIONS["flush_interval"] = args.flush_interval
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    machine = protocol.machine()
    workdir = tempfile.mkdtemp(prefix="mltrace-bench-mlflow-")
    os.environ["MLFLOW_TRACKING_URI"] = args.tracking_uri or f"sqlite:///{workdir}/mlflow.db"
    cwd = os.getcwd()
    os.chdir(workdir)  # MLflow's default artifact root (./mlruns) goes to the temp folder too
    try:
        import mlflow

        mlflow.MlflowClient().search_experiments()  # create/migrate the store before timing
        results = benchmark(args.steps, args.runs, args.batch, workdir, not args.no_baseline, names)
    finally:
        os.chdir(cwd)
        shutil.rmtree(workdir, ignore_errors=True)
    import mlflow

    import mltrace

    report = {"steps": args.steps, "runs": args.runs, "batch": args.batch, "collections": COLLECTIONS,
              "mlflow_metrics_per_step": 2, "results": results,
              "env": {"python": machine["python"], "torch": torch.__version__, "mlflow": mlflow.__version__,
                      "mltrace": mltrace.__version__, "torch_threads": torch.get_num_threads(),
                      "cpu_count": machine["cores"]},
              "machine": machine, "load_end": protocol.load_average()}
    if args.json:
        print(json.dumps(report))
        return 0
    for name, r in results["variants"].items():
        runs = ", ".join(f"{v:.2f}" for v in r["runs_loop_ms_per_step"])
        print(f"{name:19s} loop {r['loop_ms_per_step']:7.3f} ms/step (median of {args.runs}: {runs}); "
              f"close {r['close_ms']:5.0f} ms")
        print(f"{'':19s} CPU ms/step: process {r['cpu_ms_per_step']:.3f}, training thread "
              f"{r['training_thread_cpu_ms_per_step']:.3f}, sink thread {r['sink_thread_cpu_ms_per_step']:.3f}, "
              f"helper process {r['helper_process_cpu_ms_per_step']:.3f}")
    for name, ratio in results["ratios_vs_hook"].items():
        print(f"{name} / hook: training loop {ratio['loop']:.3f} (target < 1.05; median of per-round "
              f"ratios {ratio['loop_paired_median']:.3f}); loop + close "
              f"{ratio['loop_plus_close']:.3f}; this process's CPU {ratio['process_cpu']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
