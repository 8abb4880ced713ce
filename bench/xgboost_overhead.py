"""Overhead of mltrace's XGBoost hook: 100 boosting rounds with no hook vs mltrace, side by side.

Workload: XGBoost regression (``reg:squarederror``, max_depth 6, eta 0.1, ``nthread=1``, CPU
``hist``) on a synthetic data set (``--rows`` x ``--features``, 20,000 x 20 by default, plus a
validation set of a quarter that size), ``--rounds`` rounds, evaluated on train and validation
every round (so every round has two metrics to save). DMatrix construction is not timed.

Configurations, their runs interleaved (the warm-up of each, then measured run k of each in turn,
so that all see the same machine state):

- ``none``: ``xgb.train`` with no hook;
- ``mltrace/1``, ``mltrace/100``: ``mltrace.xgboost.Hook`` with its defaults (collection
  metrics) saving every round and every 100 rounds. The target: mltrace/100 under 5% above
  none.
- with ``--extra`` (informative, not a target): ``all/1``, ``all/100``: every XGBoost collection
  (metrics, losses, hyperparameters, predictions and labels on the validation set, feature
  importance, trees, full and average SHAP on a 200-row sample of the training set; exact
  TreeSHAP is by far XGBoost's most expensive call here).

Protocol (bench/protocol.py): one thread (``nthread=1``, OMP/MKL threads 1), one warm-up
and ``--runs`` (5) measured runs per configuration, the median reported. A run is: a fresh hook
on a fresh out_dir, ``xgb.train``, then ``hook.close()``, all timed (close() waits for the
background writer, so deferred work is counted). Wall time per round and process CPU time per
round (all threads) are both reported, and, as a decomposition that other processes' load moves
little, the wall time spent inside the hook's callbacks and close() ("hook ms"). Logs at error
level. On a loaded machine the wall ratios of a few percent are within run-to-run noise: read
them next to the CPU ratio and hook ms.

smdebug is not in the table: its only environment here (.venv-legacy, numpy<2) has no xgboost,
and its XGBoost hook imports pkg_resources and xgboost.rabit-era APIs; the target is relative
to no hook.

Example:
    .venv/bin/python bench/xgboost_overhead.py              # about 1-2 minutes on one core
    .venv/bin/python bench/xgboost_overhead.py --extra --json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shutil
import tempfile
import time
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np  # noqa: E402
import xgboost as xgb  # noqa: E402

import mltrace  # noqa: E402
import mltrace.xgboost as smd  # noqa: E402

import protocol  # noqa: E402

PARAMS = {"objective": "reg:squarederror", "max_depth": 6, "eta": 0.1, "nthread": 1,
          "tree_method": "hist", "seed": 0}
ALL_COLLECTIONS = ["metrics", "losses", "hyperparameters", "predictions", "labels",
                   "feature_importance", "full_shap", "average_shap", "trees"]
TARGET = 1.05


def make_data(rows: int, features: int, seed: int = 0) -> dict[str, xgb.DMatrix]:
    rng = np.random.default_rng(seed)
    n_val = rows // 4
    x = rng.normal(size=(rows + n_val, features)).astype(np.float32)
    w = rng.normal(size=features)
    y = x @ w + np.sin(3 * x[:, 0]) * x[:, 1] + rng.normal(scale=0.5, size=rows + n_val)
    return {
        "train": xgb.DMatrix(x[:rows], label=y[:rows]),
        "validation": xgb.DMatrix(x[rows:], label=y[rows:]),
        "shap_sample": xgb.DMatrix(x[:200], label=y[:200]),
    }


def configs(extra: bool) -> dict[str, dict[str, Any] | None]:
    out: dict[str, dict[str, Any] | None] = {"none": None, "mltrace/1": {"interval": 1},
                                              "mltrace/100": {"interval": 100}}
    if extra:
        out["all/1"] = {"interval": 1, "all": True}
        out["all/100"] = {"interval": 100, "all": True}
    return out


def _timed_callback(hook: Any, spent: list[float]) -> None:
    """Add the wall time of every after_iteration call of ``hook`` to ``spent[0]``."""
    inner = hook.after_iteration

    def after_iteration(model: Any, epoch: int, evals_log: Any) -> bool:
        start = time.perf_counter()
        try:
            return inner(model, epoch, evals_log)
        finally:
            spent[0] += time.perf_counter() - start

    hook.after_iteration = after_iteration


def one_run(config: dict[str, Any] | None, data: dict[str, xgb.DMatrix], rounds: int,
            out_dir: str) -> tuple[float, float, float]:
    """(wall ms, process CPU ms, ms inside the hook) per round of xgb.train + hook.close()."""
    callbacks = []
    hook = None
    spent = [0.0]
    if config is not None:
        kwargs: dict[str, Any] = {"save_config": smd.SaveConfig(save_interval=config["interval"])}
        if config.get("all"):
            kwargs.update(include_collections=ALL_COLLECTIONS, hyperparameters=PARAMS,
                          train_data=data["shap_sample"], validation_data=data["validation"])
        hook = smd.Hook(out_dir=out_dir, **kwargs)
        _timed_callback(hook, spent)
        callbacks.append(hook)
    evals = [(data["train"], "train"), (data["validation"], "validation")]
    gc.collect()
    cpu_start, start = time.process_time(), time.perf_counter()
    xgb.train(PARAMS, data["train"], rounds, evals=evals, callbacks=callbacks, verbose_eval=False)
    if hook is not None:
        closing = time.perf_counter()
        hook.close()
        spent[0] += time.perf_counter() - closing
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return wall * 1000.0 / rounds, cpu * 1000.0 / rounds, spent[0] * 1000.0 / rounds


def benchmark(rounds: int, runs: int, rows: int, features: int, extra: bool,
              workdir: str) -> dict[str, Any]:
    data = make_data(rows, features)
    cfgs = configs(extra)
    counter = 0

    def timed(name: str) -> tuple[float, float, float]:
        nonlocal counter
        counter += 1
        out_dir = os.path.join(workdir, f"run_{counter}")
        try:
            return one_run(cfgs[name], data, rounds, out_dir)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    measured = protocol.interleaved({name: functools.partial(timed, name) for name in cfgs}, runs)
    wall, cpu, hook = (protocol.pick(measured, i) for i in range(3))
    return {
        name: {
            "ms_per_round": wall[name].median,
            "cpu_ms_per_round": cpu[name].median,
            "hook_ms_per_round": hook[name].median,
            "runs_ms_per_round": wall[name].runs,
            "runs_cpu_ms_per_round": cpu[name].runs,
            "runs_hook_ms_per_round": hook[name].runs,
            "warmup_ms_per_round": wall[name].warmup,
        }
        for name in cfgs
    }


def table(report: dict[str, Any]) -> str:
    results = report["results"]
    base, base_cpu = results["none"]["ms_per_round"], results["none"]["cpu_ms_per_round"]
    lines = [
        f"XGBoost {report['env']['xgboost']}, mltrace {report['env']['mltrace']}: "
        f"{report['rounds']} rounds, "
        f"{report['rows']} x {report['features']} rows, nthread=1, median of {report['runs']} runs "
        f"(load {report['load_start']} -> {report['load_end']}; commit {report['machine']['commit']})",
        f"{'config':<13}{'ms/round':>10}{'+added':>9}{'ratio':>8}{'cpu ms':>9}{'cpu ratio':>11}"
        f"{'hook ms':>9}{'hook ratio':>12}",
    ]
    for name, r in results.items():
        lines.append(
            f"{name:<13}{r['ms_per_round']:>10.3f}{r['ms_per_round'] - base:>+9.3f}"
            f"{r['ms_per_round'] / base:>8.3f}{r['cpu_ms_per_round']:>9.3f}"
            f"{r['cpu_ms_per_round'] / base_cpu:>11.3f}{r['hook_ms_per_round']:>9.3f}"
            f"{(base + r['hook_ms_per_round']) / base:>12.3f}"
        )
    ratio = results["mltrace/100"]["ms_per_round"] / base
    verdict = "met" if ratio < TARGET else "NOT met"
    lines.append(f"target: mltrace/100 under {TARGET:.2f}x no hook: {ratio:.3f}x (wall), "
                 f"{results['mltrace/100']['cpu_ms_per_round'] / base_cpu:.3f}x (cpu), {verdict}")
    lines.append("hook ms: time inside the hook's callbacks and close() per round; hook ratio: "
                 "(none + hook ms) / none")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5, help="measured runs (after one warm-up)")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--extra", action="store_true", help="also time every collection (informative)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--results",
                        default=os.path.join(os.path.dirname(__file__), "results", "xgboost.json"),
                        help="where the report is written ('' for nowhere)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or args.rows < 1000:
        parser.error("--rounds and --runs must be >= 1, --rows >= 1000")

    protocol.warn_if_busy()
    machine = protocol.machine()
    load_start = protocol.load_average()
    workdir = tempfile.mkdtemp(prefix="mltrace-xgb-bench-")
    try:
        results = benchmark(args.rounds, args.runs, args.rows, args.features, args.extra, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "rounds": args.rounds, "runs": args.runs, "rows": args.rows, "features": args.features,
        "params": PARAMS, "results": results,
        "load_start": round(load_start, 2),
        "load_end": round(protocol.load_average(), 2),
        "env": {"python": machine["python"], "xgboost": xgb.__version__,
                "mltrace": mltrace.__version__, "numpy": np.__version__, "cpu_count": machine["cores"],
                "executable": machine["executable"]},
        "machine": machine,
    }
    if args.results:
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report) if args.json else table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
