"""Latency of the mltrace TensorBoard plugin's routes, through its WSGI apps (werkzeug client).

1. Tensor route: ``/series`` for one tensor over 1000 steps of a trial holding 100 tensors per
   step (each saved raw, 256 floats, plus 4 stored reductions). Reported: opening the trial, the
   first (cold) request for a tensor on the open trial, and the warm request (target < 200 ms).
2. Time to first panel on a 10,000-step trial (10 tensors per step): what the tab does when
   opened, on a fresh plugin: ``/runs``, ``/run`` (modes, tensors), ``/series`` of the first
   tensor over all 10,000 steps.

Protocol (bench/README.md): one warm-up then ``--runs`` measured runs, medians. Cold
numbers use a fresh plugin (and, for the trial, a fresh Trial) each run; the OS page cache is warm.

    .venv/bin/python bench/tb_plugin_latency.py [--runs 5] [--json] [--workdir DIR --keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np  # noqa: E402

from mltrace.collections import Collection, CollectionManager  # noqa: E402
from mltrace.modes import ModeKeys  # noqa: E402
from mltrace.reductions import reduction_tensor_name  # noqa: E402
from mltrace.storage import open_storage  # noqa: E402
from mltrace.writer import TrialWriter  # noqa: E402

REDUCTIONS = ("min", "max", "mean", "l2")


def write_trial(path: str, steps: int, tensors: int, size: int, reductions: bool) -> None:
    if os.path.exists(os.path.join(path, "training_job_end.ts")):
        return
    writer = TrialWriter(open_storage(path), "worker_0")
    manager = CollectionManager()
    manager.add(Collection("weights", include_regex=["^layer"]))
    writer.write_collections(manager.to_json())
    rng = np.random.default_rng(0)
    base = rng.normal(size=(tensors, size)).astype(np.float32)
    for step in range(steps):
        writer.open_step(step, ModeKeys.TRAIN, step)
        for t in range(tensors):
            name = f"layer{t:03d}.weight"
            value = base[t] * (1 + step * 1e-3)
            writer.add_tensor(name, value, ModeKeys.TRAIN, step, wall_time=1.0)
            if reductions:
                for red in REDUCTIONS:
                    r = {"min": value.min(), "max": value.max(), "mean": value.mean(), "l2": np.linalg.norm(value)}[red]
                    writer.add_tensor(reduction_tensor_name(name, red, False), np.asarray(r, dtype=np.float64),
                                      ModeKeys.TRAIN, step, wall_time=1.0)
        writer.close_step()
    writer.write_end_marker()
    writer.close()


def client_for(root: str):
    from tensorboard.plugins import base_plugin
    from werkzeug import Request, Response
    from werkzeug.test import Client

    from tb_plugin.plugin import MltracePlugin

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
    samples: dict[str, list[float]] = {"open_trial_s": [], "cold_series_s": [], "warm_series_s": []}
    for i in range(runs + 1):
        plugin, get = client_for(root)
        start = time.perf_counter()
        plugin.trial(trial_name)
        opened = time.perf_counter() - start
        cold, body = get("/series", run=trial_name, tensor="layer042.weight")
        steps = body["runs"][0]["modes"]["TRAIN"]["steps"]
        assert len(steps) == 1000 and "downsampled" not in body["runs"][0]["modes"]["TRAIN"]
        warm = statistics.median(get("/series", run=trial_name, tensor="layer042.weight")[0] for _ in range(5))
        if i:  # the first pass is the warm-up
            samples["open_trial_s"].append(opened)
            samples["cold_series_s"].append(cold)
            samples["warm_series_s"].append(warm)
    return {k: statistics.median(v) for k, v in samples.items()} | {"raw": samples}


def bench_first_panel(root: str, runs: int) -> dict:
    samples: list[float] = []
    parts: list[dict] = []
    for i in range(runs + 1):
        _, get = client_for(root)
        t_runs, body = get("/runs")
        name = [r["name"] for r in body["runs"] if r["name"] == "t10x10000"][0]
        t_run, info = get("/run", run=name)
        first = info["tensors"][0]
        t_series, series = get("/series", run=name, tensor=first)
        assert len(series["runs"][0]["modes"]["TRAIN"]["steps"]) == 10_000
        if i:
            samples.append(t_runs + t_run + t_series)
            parts.append({"runs_s": t_runs, "run_s": t_run, "series_s": t_series})
    return {"first_panel_s": statistics.median(samples),
            "parts_median": {k: statistics.median(p[k] for p in parts) for k in parts[0]}, "raw": parts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workdir", default=None, help="where the trials are written (reused if present)")
    parser.add_argument("--keep", action="store_true", help="keep the trials")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="mltrace-bench-plugin-")
    try:
        start = time.perf_counter()
        write_trial(os.path.join(workdir, "t100x1000"), steps=1000, tensors=100, size=256, reductions=True)
        write_trial(os.path.join(workdir, "t10x10000"), steps=10_000, tensors=10, size=64, reductions=False)
        written = time.perf_counter() - start
        tensor = bench_tensor_route(workdir, args.runs)
        panel = bench_first_panel(workdir, args.runs)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {"runs": args.runs, "write_s": written, "tensor_route": tensor, "first_panel": panel,
              "loadavg": os.getloadavg()}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"median of {args.runs} runs, load {os.getloadavg()[0]:.2f} (trials written in {written:.0f} s)")
    print("1000 steps x 100 tensors/step (raw 256 floats + 4 stored reductions each), /series of one tensor:")
    print(f"  open the trial (index of 1000 steps)      {1000 * tensor['open_trial_s']:8.1f} ms")
    print(f"  first request for the tensor (cold)        {1000 * tensor['cold_series_s']:8.1f} ms")
    print(f"  repeated request (warm; target < 200 ms)   {1000 * tensor['warm_series_s']:8.1f} ms")
    p = panel["parts_median"]
    print("10,000-step trial (10 tensors/step), fresh plugin: /runs + /run + /series of the first tensor:")
    print(f"  time to first panel                        {1000 * panel['first_panel_s']:8.1f} ms "
          f"(runs {1000 * p['runs_s']:.0f}, run {1000 * p['run_s']:.0f}, series {1000 * p['series_s']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
