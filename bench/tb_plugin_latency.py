"""Latency of the mltrace TensorBoard plugin's routes, through its WSGI apps (werkzeug client).

1. Tensor route: ``/series`` for one tensor over 1000 steps of a trial holding 100 tensors per
   step (each saved raw, 256 floats, plus 4 stored reductions). Reported: opening the trial, the
   first (cold) request for a tensor on the open trial, and the warm request (target < 200 ms).
2. Time to first panel on a 10,000-step trial (10 tensors per step): what the tab does when
   opened, on a fresh plugin: ``/runs``, ``/run`` (modes, tensors), ``/series`` of the first
   tensor over all 10,000 steps.
3. Time to first overview on a 200-tensor, 5,000-step trial (gradients, the l2 stored at every
   step): what the tab does when opened (``/runs``, ``/run``, ``/overview`` at 1000 columns).
   Warm: the tab opened again in the same TensorBoard (target < 1 s), median of ``--runs``.
   Cold (``--cold-runs``, default 1: each reads 1M records): a fresh plugin and an empty
   statistics cache folder (``MLTRACE_CACHE_DIR``), the first answer (opening the trial, then
   1 s of reading, coarse first) and the asks until every step is in. Seen before: a fresh
   plugin on the trial whose statistics the cold run saved (a new TensorBoard, the same
   machine), median of ``--runs``.
   With ``--raw``, the same on 200 gradients x 5,000 steps saved raw only (no reduction stored),
   once cold, once seen before, then the statistic switched on the warm plugin (nothing is read
   again).

Protocol (bench/protocol.py): one warm-up then ``--runs`` measured runs, medians. Cold
numbers use a fresh plugin (and, for the trial, a fresh Trial) each run; the OS page cache is warm.

    .venv/bin/python bench/tb_plugin_latency.py [--runs 5] [--json] [--workdir DIR --keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np  # noqa: E402

from mltrace.collections import Collection, CollectionManager  # noqa: E402
from mltrace.modes import ModeKeys  # noqa: E402
from mltrace.reductions import reduction_tensor_name  # noqa: E402
from mltrace.storage import open_storage  # noqa: E402
from mltrace.writer import TrialWriter  # noqa: E402

import protocol  # noqa: E402

REDUCTIONS = ("min", "max", "mean", "l2")


def _write(path: str, collection: str, regex: str, steps: int,
           records: Callable[[int], Iterator[tuple[str, np.ndarray]]]) -> None:
    """A one-worker trial of ``steps`` TRAIN steps whose records at a step are ``records(step)``,
    collection ``collection`` matching ``regex``; kept as it is when already written."""
    if os.path.exists(os.path.join(path, "training_job_end.ts")):
        return
    writer = TrialWriter(open_storage(path), "worker_0")
    manager = CollectionManager()
    manager.add(Collection(collection, include_regex=[regex]))
    writer.write_collections(manager.to_json())
    for step in range(steps):
        writer.open_step(step, ModeKeys.TRAIN, step)
        for name, value in records(step):
            writer.add_tensor(name, value, ModeKeys.TRAIN, step, wall_time=1.0)
        writer.close_step()
    writer.write_end_marker()
    writer.close()


def write_trial(path: str, steps: int, tensors: int, size: int, reductions: bool) -> None:
    """``tensors`` weights of ``size`` floats saved raw at each step, with REDUCTIONS stored
    beside them when ``reductions``."""
    base = np.random.default_rng(0).normal(size=(tensors, size)).astype(np.float32)

    def records(step: int) -> Iterator[tuple[str, np.ndarray]]:
        for t in range(tensors):
            name = f"layer{t:03d}.weight"
            value = base[t] * (1 + step * 1e-3)
            yield name, value
            if reductions:
                for red in REDUCTIONS:
                    r = {"min": value.min(), "max": value.max(), "mean": value.mean(), "l2": np.linalg.norm(value)}[red]
                    yield reduction_tensor_name(name, red, False), np.asarray(r, dtype=np.float64)

    _write(path, "weights", "^layer", steps, records)


def write_gradients(path: str, steps: int, tensors: int) -> None:
    """A trial of ``tensors`` gradients whose l2 is stored at each of ``steps`` TRAIN steps."""
    scale = 10.0 ** np.random.default_rng(0).uniform(-8, 0, size=tensors)
    names = [reduction_tensor_name(f"gradient/layer{t:03d}.weight", "l2", False) for t in range(tensors)]

    def records(step: int) -> Iterator[tuple[str, np.ndarray]]:
        for t, name in enumerate(names):
            yield name, np.float64(scale[t] * (1 + 1e-4 * step))

    _write(path, "gradients", "^gradient/", steps, records)


def write_raw_gradients(path: str, steps: int, tensors: int, size: int = 16) -> None:
    """A trial of ``tensors`` gradients saved raw (``size`` floats, no reduction stored) at each
    of ``steps`` TRAIN steps: what the overview must decode to show anything."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(tensors, size)) * 10.0 ** rng.uniform(-8, 0, size=(tensors, 1))
    names = [f"gradient/layer{t:03d}.weight" for t in range(tensors)]

    def records(step: int) -> Iterator[tuple[str, np.ndarray]]:
        for t, name in enumerate(names):
            yield name, (base[t] * (1 + 1e-4 * step)).astype(np.float32)

    _write(path, "gradients", "^gradient/", steps, records)


def client_for(root: str):
    from tensorboard.plugins import base_plugin
    from werkzeug import Request, Response
    from werkzeug.test import Client

    from mltrace_tb.plugin import MltracePlugin

    plugin = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[root])
    apps = plugin.get_plugin_apps()

    @Request.application
    def app(request):
        route = "/" + request.path.rsplit("/", 1)[-1]
        return apps[route]

    def get(route: str, **params) -> tuple[float, dict]:
        start = time.perf_counter()
        response = Client(app, Response).get(f"/data/plugin/mltrace{route}", query_string=params)
        elapsed = time.perf_counter() - start
        assert response.status_code == 200, response.get_data()
        return elapsed, json.loads(response.get_data())

    return plugin, get


def bench_tensor_route(root: str, runs: int) -> dict:
    trial_name = "t100x1000"

    def one() -> dict[str, float]:
        plugin, get = client_for(root)
        start = time.perf_counter()
        plugin.trial(trial_name)
        opened = time.perf_counter() - start
        cold, body = get("/series", run=trial_name, tensor="layer042.weight")
        steps = body["runs"][0]["modes"]["TRAIN"]["steps"]
        assert len(steps) == 1000 and "downsampled" not in body["runs"][0]["modes"]["TRAIN"]
        warm = protocol.median(get("/series", run=trial_name, tensor="layer042.weight")[0] for _ in range(5))
        return {"open_trial_s": opened, "cold_series_s": cold, "warm_series_s": warm}

    measured = protocol.interleaved({"tensor": one}, runs)  # the first pass is the warm-up
    samples = {k: protocol.pick(measured, k)["tensor"] for k in ("open_trial_s", "cold_series_s", "warm_series_s")}
    return {k: m.median for k, m in samples.items()} | {"raw": {k: m.runs for k, m in samples.items()}}


def bench_first_panel(root: str, runs: int) -> dict:
    def one() -> dict[str, float]:
        _, get = client_for(root)
        t_runs, body = get("/runs")
        name = [r["name"] for r in body["runs"] if r["name"] == "t10x10000"][0]
        t_run, info = get("/run", run=name)
        first = info["tensors"][0]
        t_series, series = get("/series", run=name, tensor=first)
        assert len(series["runs"][0]["modes"]["TRAIN"]["steps"]) == 10_000
        return {"runs_s": t_runs, "run_s": t_run, "series_s": t_series}

    measured = protocol.interleaved({"panel": one}, runs)  # the first pass is the warm-up
    parts = measured["panel"].runs
    return {"first_panel_s": protocol.median(p["runs_s"] + p["run_s"] + p["series_s"] for p in parts),
            "parts_median": {k: protocol.pick(measured, k)["panel"].median for k in parts[0]},
            "raw": parts}


def open_overview(get, name: str = "g200x5000") -> tuple[float, dict]:
    """What the tab asks for when it opens on the overview: /runs, /run, /overview."""
    t_runs, body = get("/runs")
    name = [r["name"] for r in body["runs"] if r["name"] == name][0]
    t_run, _ = get("/run", run=name)
    t_ov, ov = get("/overview", run=name, columns="1000")
    assert len(ov["rows"]) == 200 and (len(ov["starts"]) == 1000 or not ov["complete"])
    return t_runs + t_run + t_ov, ov


def fresh_look(root: str, name: str, cache_dir: str) -> tuple[float, float, int]:
    """A fresh plugin (a new TensorBoard) with statistics cache folder ``cache_dir``: the first
    answer, the time until every step is in, and how many asks that took."""
    os.environ["MLTRACE_CACHE_DIR"] = cache_dir
    _, get = client_for(root)
    start = time.perf_counter()
    first, ov = open_overview(get, name)
    n = 1
    while not ov["complete"]:
        ov = get("/overview", run=name, columns="1000")[1]
        n += 1
    return first, time.perf_counter() - start, n


def bench_overview(root: str, runs: int, cold_runs: int) -> dict:
    kept = tempfile.mkdtemp(prefix="mltrace-bench-cache-")

    def cold() -> tuple[float, float, int]:  # each with an empty cache folder; the last one kept
        shutil.rmtree(kept, ignore_errors=True)
        return fresh_look(root, "g200x5000", kept)

    colds = protocol.interleaved({"cold": cold}, cold_runs, warmup=False)  # each one a first
    cold_first, cold_all, asks = (protocol.pick(colds, i)["cold"] for i in range(3))
    seen = protocol.interleaved({"seen": lambda: fresh_look(root, "g200x5000", kept)}, runs,
                                warmup=False)
    seen_first, seen_all = (protocol.pick(seen, i)["seen"] for i in range(2))
    _, get = client_for(root)
    ov = open_overview(get)[1]
    while not ov["complete"]:  # the warm-up: every step read once
        ov = get("/overview", run="g200x5000", columns="1000")[1]
    warm = protocol.interleaved({"warm": lambda: open_overview(get)[0]}, runs, warmup=False)["warm"]
    assert ov["steps"] == 5000 and sum(sum(r["count"]) for r in ov["rows"]) == 200 * 5000
    shutil.rmtree(kept, ignore_errors=True)
    return {"warm_s": warm.median, "cold_first_s": cold_first.median,
            "cold_complete_s": cold_all.median, "cold_asks": asks.runs,
            "seen_first_s": seen_first.median, "seen_complete_s": seen_all.median,
            "raw": {"warm": warm.runs, "cold_first": cold_first.runs, "cold_complete": cold_all.runs,
                    "seen_first": seen_first.runs, "seen_complete": seen_all.runs}}


def bench_raw_overview(root: str) -> dict:
    """The raw-only trial, once cold (a fresh plugin, an empty cache folder): the first answer,
    every step read; then once seen before (a fresh plugin on the cache folder the cold look
    filled); then the statistic switched (abs_max, then zero_fraction) on that plugin."""
    kept = tempfile.mkdtemp(prefix="mltrace-bench-cache-")
    first, complete, n = fresh_look(root, "r200x5000", kept)
    seen_first, seen_complete, seen_asks = fresh_look(root, "r200x5000", kept)
    _, get = client_for(root)
    ov = open_overview(get, "r200x5000")[1]
    assert ov["complete"] and ov["steps"] == 5000
    assert sum(sum(r["count"]) for r in ov["rows"]) == 200 * 5000
    switch = {}
    for statistic in ("abs_max", "zero_fraction"):
        elapsed, sw = get("/overview", run="r200x5000", columns="1000", statistic=statistic)
        assert sw["complete"], f"switching to {statistic} read steps again"
        switch[statistic] = elapsed
    shutil.rmtree(kept, ignore_errors=True)
    return {"cold_first_s": first, "cold_complete_s": complete, "asks": n, "switch_s": switch,
            "seen_first_s": seen_first, "seen_complete_s": seen_complete, "seen_asks": seen_asks}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workdir", default=None, help="where the trials are written (reused if present)")
    parser.add_argument("--keep", action="store_true", help="keep the trials")
    parser.add_argument("--cold-runs", type=int, default=1,
                        help="cold overview openings (each reads every step of 200x5000)")
    parser.add_argument("--raw", action="store_true",
                        help="also the overview of 200 gradients x 5,000 steps saved raw only "
                             "(written once, about 2 min; read cold once)")
    parser.add_argument("--only", choices=["overview"], default=None,
                        help="run only this part")
    args = parser.parse_args()
    protocol.warn_if_busy()
    machine = protocol.machine()
    workdir = args.workdir or tempfile.mkdtemp(prefix="mltrace-bench-plugin-")
    # the routes' statistics cache in a folder of the benchmark's, not the user's ~/.cache
    cache_dir = os.environ["MLTRACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="mltrace-bench-cache-")
    try:
        start = time.perf_counter()
        if args.only is None:
            write_trial(os.path.join(workdir, "t100x1000"), steps=1000, tensors=100, size=256,
                        reductions=True)
            write_trial(os.path.join(workdir, "t10x10000"), steps=10_000, tensors=10, size=64,
                        reductions=False)
        write_gradients(os.path.join(workdir, "g200x5000"), steps=5000, tensors=200)
        written = time.perf_counter() - start
        tensor = bench_tensor_route(workdir, args.runs) if args.only is None else None
        panel = bench_first_panel(workdir, args.runs) if args.only is None else None
        over = bench_overview(workdir, args.runs, args.cold_runs)
        if args.raw:
            write_raw_gradients(os.path.join(workdir, "r200x5000"), steps=5000, tensors=200)
            over["raw_only"] = bench_raw_overview(workdir)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {"runs": args.runs, "write_s": written, "tensor_route": tensor, "first_panel": panel,
              "overview": over, "loadavg": protocol.load_average(), "machine": machine}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"median of {args.runs} runs, load {protocol.load_average():.2f} (trials written in {written:.0f} s); "
          f"commit {machine['commit']}")
    print_overview(over)
    if "raw_only" in over:
        print_raw(over["raw_only"])
    if tensor is None or panel is None:
        return 0
    print("1000 steps x 100 tensors/step (raw 256 floats + 4 stored reductions each), /series of one tensor:")
    print(f"  open the trial (index of 1000 steps)      {1000 * tensor['open_trial_s']:8.1f} ms")
    print(f"  first request for the tensor (cold)        {1000 * tensor['cold_series_s']:8.1f} ms")
    print(f"  repeated request (warm; target < 200 ms)   {1000 * tensor['warm_series_s']:8.1f} ms")
    p = panel["parts_median"]
    print("10,000-step trial (10 tensors/step), fresh plugin: /runs + /run + /series of the first tensor:")
    print(f"  time to first panel                        {1000 * panel['first_panel_s']:8.1f} ms "
          f"(runs {1000 * p['runs_s']:.0f}, run {1000 * p['run_s']:.0f}, series {1000 * p['series_s']:.0f})")
    return 0


def print_raw(raw: dict) -> None:
    print("200 gradients x 5,000 steps saved raw only (16 floats each), fresh plugin, once:")
    print(f"  first answer (target < 1 s)                {1000 * raw['cold_first_s']:8.1f} ms")
    print(f"  every step read (target < 3 s)             {1000 * raw['cold_complete_s']:8.1f} ms ({raw['asks']} asks)")
    print(f"  seen before (fresh plugin, cache folder kept): first answer {1000 * raw['seen_first_s']:8.1f} ms, "
          f"every step {1000 * raw['seen_complete_s']:8.1f} ms ({raw['seen_asks']} asks)")
    for statistic, elapsed in raw["switch_s"].items():
        print(f"  then the statistic switched to {statistic:13s} {1000 * elapsed:8.1f} ms (nothing read again)")


def print_overview(over: dict) -> None:
    print("200 gradients x 5,000 steps (l2 stored), /runs + /run + /overview (1000 columns):")
    print(f"  opened again (warm; target < 1 s)          {1000 * over['warm_s']:8.1f} ms")
    print(f"  first opening, fresh plugin: first answer  {1000 * over['cold_first_s']:8.1f} ms "
          f"({over['cold_first_s'] / over['warm_s']:.1f}x warm; opens the trial, 1 s of reading)")
    print(f"  first opening: every step read             {1000 * over['cold_complete_s']:8.1f} ms "
          f"({over['cold_complete_s'] / over['warm_s']:.0f}x warm; {over['cold_asks']} asks)")
    print(f"  seen before, fresh plugin: first answer    {1000 * over['seen_first_s']:8.1f} ms "
          f"(target < 1 s), every step {1000 * over['seen_complete_s']:8.1f} ms (target < 3 s)")


if __name__ == "__main__":
    sys.exit(main())
