"""Time per training step of a small Gluon MLP with no hook, mltrace's MXNet hook and smdebug's.

Runs in .venv-legacy (MXNet 1.9.1 needs numpy<1.24; smdebug 1.0.34 lives there too):

    .venv-legacy/bin/python bench/mxnet_overhead.py       # none, mltrace, smdebug at 1 and 100
    .venv-legacy/bin/python bench/mxnet_overhead.py --libs none,mltrace --intervals 100 --json

Model: MLP 32-64-1 (``Dense(64, activation="relu")``, ``Dense(1)``), L2Loss, ``gluon.Trainer``
SGD (lr 0.01), batch 64, ``--steps`` steps, one fixed batch per step made before timing, the
loop as MXNet's tutorials write it (``autograd.record()``, ``backward()``, ``trainer.step``,
and ``loss.mean().asscalar()`` for the running loss, a sync point every step; ``--no-step-sync``
drops it). The hook is created as a user would::

    hook = smd.Hook(out_dir=..., save_config=smd.SaveConfig(save_interval=N),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_block(net); hook.register_block(loss_fn)

with ``smd`` = ``mltrace.mxnet`` or ``smdebug.mxnet``; N = 1 (every step: 2 weights, 2 biases,
4 gradients and the loss) and N = 100.

Protocol (bench/protocol.py): one thread (``OMP_NUM_THREADS=1``,
``MXNET_ENGINE_TYPE=NaiveEngine``: operators run synchronously on the Python thread, as torch's
CPU ops do in bench/pytorch_overhead.py; ``--engine threaded`` keeps MXNet's default engine with
``MXNET_CPU_WORKER_NTHREADS=1``; set before MXNet is imported), per (interval, library) one
warm-up run, then ``--runs`` measured runs, the median reported. All runs are interleaved (round
k runs every interval and library in turn), so that all see the same machine state. A run is:
fresh model, fresh hook on a fresh out_dir, the steps, ``mx.nd.waitall()`` and ``hook.close()``
inside the timed region (both libraries may write in a background thread; close() waits for it).
Hook construction and registration are not timed. Process CPU time is reported beside wall time.

Columns: ms/step (wall); overhead = (library / none - 1) in percent, none measured in the same
rounds and interval (target: mltrace under 5% at interval 100); (cpu) = the same from process
CPU time, which other processes' load hardly moves; (paired) = median over rounds of each run
over the no-hook run of its round; (self) = the training thread's CPU time inside mltrace's
callbacks over the rest of the loop's (extra runs with those callbacks timed; the number that
other processes' load moves least); mlt/smd added = mltrace's added wall ms over smdebug's.
``--json`` prints every run; ``--table FILE`` re-prints the table of a saved ``--json``.
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
from collections.abc import Callable
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS"):
    os.environ.setdefault(_var, "1")


def _engine_arg(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith("--engine="):
            return arg.split("=", 1)[1]
        if arg == "--engine" and i + 1 < len(argv):
            return argv[i + 1]
    return "naive"


# MXNet reads its engine type when imported: --engine acts here, before `import mxnet`.
ENGINES = {"naive": "NaiveEngine", "threaded": "ThreadedEnginePerDevice"}
os.environ.setdefault("MXNET_ENGINE_TYPE", ENGINES.get(_engine_arg(sys.argv), "NaiveEngine"))
os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import protocol  # noqa: E402

LIBS = ("none", "mltrace", "smdebug")
COLLECTIONS = ["weights", "biases", "gradients", "losses"]
BATCH, N_IN, N_HIDDEN, N_OUT = 64, 32, 64, 1


def make_data(steps: int, seed: int = 0) -> list[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
    rng = np.random.default_rng(seed)
    return [(mx.nd.array(rng.standard_normal((BATCH, N_IN))),
             mx.nd.array(rng.standard_normal((BATCH, N_OUT)))) for _ in range(steps)]


def make_model(seed: int = 0) -> tuple[gluon.HybridBlock, gluon.loss.Loss]:
    mx.random.seed(seed)
    with mx.name.NameManager():  # the same block names (dense0, dense1) in every run
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(N_HIDDEN, activation="relu", in_units=N_IN),
                gluon.nn.Dense(N_OUT, in_units=N_HIDDEN))
        loss_fn = gluon.loss.L2Loss()
    net.initialize(mx.init.Xavier())
    return net, loss_fn


def hook_factory(lib: str) -> Callable[..., Any] | None:
    if lib == "none":
        return None
    if lib == "mltrace":
        import mltrace.mxnet as smd
    elif lib == "smdebug":
        import smdebug.mxnet as smd  # type: ignore[no-redef]
    else:
        raise SystemExit(f"unknown library {lib!r}: choose from {', '.join(LIBS)}")

    def create(out_dir: str, interval: int, net: gluon.Block, loss_fn: gluon.Block) -> Any:
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=interval),
                        include_collections=list(COLLECTIONS))
        hook.register_block(net)
        hook.register_block(loss_fn)
        return hook

    return create


def one_run(factory: Callable[..., Any] | None, out_dir: str, interval: int,
            data: list[tuple[mx.nd.NDArray, mx.nd.NDArray]],
            step_sync: bool) -> tuple[float, float, float]:
    """(wall, process CPU, this thread's CPU) ms per step of the loop, waitall() and close()."""
    net, loss_fn = make_model()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    hook = factory(out_dir, interval, net, loss_fn) if factory is not None else None
    mx.nd.waitall()
    gc.collect()
    cpu_start, start, thread_start = time.process_time(), time.perf_counter(), time.thread_time()
    running = 0.0
    for x, y in data:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(BATCH)
        if step_sync:
            running += loss.mean().asscalar()
    mx.nd.waitall()
    if hook is not None:
        hook.close()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    thread = time.thread_time() - thread_start
    return wall * 1000.0 / len(data), cpu * 1000.0 / len(data), thread * 1000.0 / len(data)


def attribute_mltrace(intervals: list[int], data: list[tuple[mx.nd.NDArray, mx.nd.NDArray]],
                      runs: int, workdir: str, step_sync: bool) -> dict[str, Any]:
    """mltrace's own share, robust to other processes' load: the training thread's CPU time
    spent inside mltrace's callbacks (forward pre-hook, forward hooks, close) over the rest of
    the loop's thread CPU time, in percent; median of ``runs`` extra runs per interval made
    with those callbacks wrapped in timers (so these runs are not among the timed ones)."""
    from mltrace.mxnet.adapter import GluonAdapter
    from mltrace.mxnet.hook import Hook

    spent = [0.0]
    # The adapter's callbacks are bound when blocks are registered, after these are wrapped.
    targets = [(GluonAdapter, "_forward_pre_hook"), (GluonAdapter, "_forward_hook"),
               (Hook, "close")]
    originals = {(cls, name): getattr(cls, name) for cls, name in targets}

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - start

        return wrapper

    out: dict[str, Any] = {}
    for (cls, name), fn in originals.items():
        setattr(cls, name, timed(fn))
    try:
        for interval in intervals:
            shares = []
            for k in range(runs):
                spent[0] = 0.0
                out_dir = os.path.join(workdir, f"attribution_{interval}_{k}")
                factory = hook_factory("mltrace")
                _, _, thread_ms = one_run(factory, out_dir, interval, data, step_sync)
                shutil.rmtree(out_dir, ignore_errors=True)
                hook_ms = spent[0] * 1000.0 / len(data)
                shares.append(hook_ms / (thread_ms - hook_ms) * 100.0)
            out[str(interval)] = {"self_pct": protocol.median(shares), "runs_self_pct": shares}
    finally:
        for (cls, name), fn in originals.items():
            setattr(cls, name, fn)
    return out


def benchmark(libs: list[str], intervals: list[int], steps: int, runs: int, workdir: str,
              step_sync: bool) -> dict[str, Any]:
    data = make_data(steps)
    factories = {lib: hook_factory(lib) for lib in libs}
    counter = 0

    def timed(lib: str, interval: int) -> tuple[float, float, float]:
        nonlocal counter
        counter += 1
        out_dir = os.path.join(workdir, f"{lib}_{interval}_{counter}")
        try:
            return one_run(factories[lib], out_dir, interval, data, step_sync)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    # every (interval, library) a setting, all interleaved
    measured = protocol.interleaved({f"{interval}/{lib}": functools.partial(timed, lib, interval)
                                     for interval in intervals for lib in libs}, runs)
    ms, cpu_ms = protocol.pick(measured, 0), protocol.pick(measured, 1)
    results: dict[str, Any] = {}
    for interval in intervals:
        row: dict[str, Any] = {}
        for lib in libs:
            cell = f"{interval}/{lib}"
            row[lib] = {
                "ms_per_step": ms[cell].median,
                "cpu_ms_per_step": cpu_ms[cell].median,
                "runs_ms_per_step": ms[cell].runs,
                "runs_cpu_ms_per_step": cpu_ms[cell].runs,
                "warmup_ms_per_step": ms[cell].warmup,
            }
        results[str(interval)] = row
    if "mltrace" in libs:
        for interval, share in attribute_mltrace(intervals, data, runs, workdir, step_sync).items():
            results[interval]["mltrace"].update(share)
    return results


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for interval, row in results.items():
        base = row.get("none", {}).get("ms_per_step")
        cpu_base = row.get("none", {}).get("cpu_ms_per_step")
        out: dict[str, Any] = {"interval": int(interval), "none_ms": base, "none_cpu_ms": cpu_base}
        for lib in ("mltrace", "smdebug"):
            if lib in row and base:
                ms, cpu = row[lib]["ms_per_step"], row[lib]["cpu_ms_per_step"]
                out[f"{lib}_ms"], out[f"{lib}_cpu_ms"] = ms, cpu
                out[f"{lib}_overhead_pct"] = (ms / base - 1.0) * 100.0
                out[f"{lib}_cpu_overhead_pct"] = (cpu / cpu_base - 1.0) * 100.0
                # Paired: the library's run over the no-hook run of the same round, then the
                # median; slow changes of the machine's load cancel within a round.
                pairs = zip(row[lib]["runs_ms_per_step"], row["none"]["runs_ms_per_step"])
                out[f"{lib}_paired_pct"] = protocol.median((a / b - 1.0) * 100.0
                                                           for a, b in pairs)
        if "self_pct" in row.get("mltrace", {}):
            out["mltrace_self_pct"] = row["mltrace"]["self_pct"]
        if "mltrace_ms" in out and "smdebug_ms" in out and out["smdebug_ms"] - base > 0:
            out["added_ratio"] = (out["mltrace_ms"] - base) / (out["smdebug_ms"] - base)
        rows.append(out)
    return rows


def print_table(rows: list[dict[str, Any]], steps: int, runs: int) -> None:
    print(f"Gluon MLP {N_IN}-{N_HIDDEN}-{N_OUT}, batch {BATCH}, {steps} steps, median of {runs} "
          f"(ms/step; overhead vs no hook in the same rounds)")
    print(f"{'interval':>8} {'none':>7} {'mltrace':>8} {'overhead':>9} {'(cpu)':>8} "
          f"{'(paired)':>9} {'(self)':>7} {'smdebug':>8} {'overhead':>9} {'(cpu)':>8} "
          f"{'(paired)':>9} {'mlt/smd added':>14}")
    for r in rows:
        def cell(key: str, fmt: str, unit: str = "") -> str:
            width = len(format(0.0, fmt)) + len(unit)
            return format(r[key], fmt) + unit if r.get(key) is not None else "-".rjust(width)

        print(f"{r['interval']:>8} {cell('none_ms', '7.3f')} {cell('mltrace_ms', '8.3f')} "
              f"{cell('mltrace_overhead_pct', '+8.1f', '%')} "
              f"{cell('mltrace_cpu_overhead_pct', '+7.1f', '%')} "
              f"{cell('mltrace_paired_pct', '+8.1f', '%')} "
              f"{cell('mltrace_self_pct', '+6.1f', '%')} "
              f"{cell('smdebug_ms', '8.3f')} {cell('smdebug_overhead_pct', '+8.1f', '%')} "
              f"{cell('smdebug_cpu_overhead_pct', '+7.1f', '%')} "
              f"{cell('smdebug_paired_pct', '+8.1f', '%')} "
              f"{cell('added_ratio', '14.2f')}")


def environment() -> dict[str, Any]:
    machine = protocol.machine()
    return {"python": machine["python"], "mxnet": mx.__version__, "numpy": np.__version__,
            "cpu_count": machine["cores"], "loadavg": protocol.load_average(), "machine": machine,
            "threads": {v: os.environ.get(v) for v in
                        ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS", "MXNET_ENGINE_TYPE")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libs", default="none,mltrace,smdebug",
                        help="comma list of none, mltrace, smdebug")
    parser.add_argument("--intervals", default="1,100", help="comma list of save intervals")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5, help="measured runs after one warm-up")
    parser.add_argument("--no-step-sync", action="store_true",
                        help="do not read the loss every step")
    parser.add_argument("--workdir", default=None,
                        help="where trials are written (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--table", metavar="FILE", help="print the table of a saved --json output")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="naive",
                        help="MXNet's engine: naive (synchronous, one thread; default) or "
                             "threaded (MXNet's default, one worker thread)")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            saved = json.load(f)
        print_table(summarize(saved["results"]), saved["steps"], saved["runs"])
        return 0
    libs = [x.strip() for x in args.libs.split(",") if x.strip()]
    if "none" not in libs:
        libs.insert(0, "none")  # overheads need the baseline
    intervals = [int(x) for x in args.intervals.split(",") if x.strip()]
    bad = any(lib not in LIBS for lib in libs) or any(i < 1 for i in intervals)
    if bad or args.steps < 1 or args.runs < 1:
        parser.error(f"--libs from {LIBS}; intervals, --steps and --runs >= 1")
    workdir = args.workdir or tempfile.mkdtemp(prefix="mltrace-bench-mxnet-")
    protocol.warn_if_busy()
    env_start = environment()
    try:
        results = benchmark(libs, intervals, args.steps, args.runs, workdir, not args.no_step_sync)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = summarize(results)
    report = {"steps": args.steps, "runs": args.runs, "batch": BATCH,
              "model": f"{N_IN}-{N_HIDDEN}-{N_OUT}",
              "collections": COLLECTIONS, "step_sync": not args.no_step_sync, "results": results,
              "summary": rows, "env": env_start, "loadavg_end": protocol.load_average()}
    if args.json:
        print(json.dumps(report))
    else:
        print_table(rows, args.steps, args.runs)
        print(f"load average at start {env_start['loadavg']:.2f}, at end {report['loadavg_end']:.2f}; "
              f"commit {env_start['machine']['commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
