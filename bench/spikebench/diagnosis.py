"""SpikeBench for ``mltrace diagnose``: over trials SpikeBench trained (``run.py --out DIR``),
is the origin layer named first and the cause class right, and do healthy runs stay quiet?

Each fault has the cause class a correct diagnosis names (``EXPECTED``); faults that strike a
block (corrupted weights, growing queries, float16 overflow) must also have that block (``h.<n>``)
as the first layer of the origin. A healthy run passes when the diagnosis finds no anomaly.
Runs of several workers are left out (the diagnosis reads one worker).

Examples:
    .venv/bin/python bench/spikebench/diagnosis.py bench/results/spikebench bench/results/spikebench-heldout
    .venv/bin/python bench/spikebench/diagnosis.py bench/results/spikebench-diagnosis --jobs 2 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

#: The cause class a correct diagnosis names, per SpikeBench fault.
EXPECTED = {
    "lr_spike": "optimizer",
    "adam_epsilon": "optimizer",
    "adam_beta2": "optimizer",
    "shuffled_labels": "data",
    "repeated_token": "data",
    "corrupted_weights": "corruption",
    "query_growth": "numerics",
    "fp16_overflow": "numerics",
}


def judge(run: dict[str, Any], report: Any) -> dict[str, Any]:
    """One run's verdict: the diagnosis' cause and origin layer against the injected fault."""
    scenario = run["scenario"]
    row = {"run": f"{scenario}-seed{run['seed']}", "scenario": scenario, "injected_at": run["injected_at"],
           "layer": run["layer"], "found": report.found, "anomaly": report.anomaly.step if report.anomaly else None,
           "onset": report.onset, "origin": report.origin_tensor, "origin_layer": report.origin_layer,
           "cause": report.cause_name}
    if scenario == "healthy":
        row["cause_ok"] = not report.found
        row["layer_ok"] = None
        return row
    row["cause_ok"] = report.found and report.cause_name == EXPECTED[scenario]
    row["layer_ok"] = None if run["layer"] is None else report.origin_layer == f"h.{run['layer']}"
    return row


def diagnose_run(path: str) -> dict[str, Any] | None:
    """The verdict on the run whose ``run.json`` is at ``path`` (None for a run not scored)."""
    from mltrace.diagnosis import diagnose
    from mltrace.trials import create_trial

    with open(path) as f:
        run = json.load(f)
    if run["workers"] > 1 or (run["scenario"] != "healthy" and run["scenario"] not in EXPECTED):
        return None
    start = time.perf_counter()
    report = diagnose(create_trial(run["trial_dir"], timeout=0))
    row = judge(run, report)
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", help="folders of SpikeBench runs (<scenario>-seed<n>/run.json)")
    parser.add_argument("--jobs", type=int, default=1, help="runs diagnosed at a time (one process each)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    paths = [os.path.join(root, entry, "run.json") for root in args.roots for entry in sorted(os.listdir(root))]
    paths = [p for p in paths if os.path.exists(p)]
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(diagnose_run, paths):
            if row is None:
                continue
            rows.append(row)
            if not args.json:
                mark = "ok " if row["cause_ok"] and row["layer_ok"] in (None, True) else "BAD"
                print(f"{mark} {row['run']:<28} at {row['injected_at']} layer {row['layer']}: found {row['found']} "
                      f"anomaly {row['anomaly']} onset {row['onset']} cause {row['cause']} "
                      f"origin {row['origin']} ({row['seconds']} s)", flush=True)
    summary: dict[str, dict[str, Any]] = defaultdict(lambda: {"runs": 0, "cause_ok": 0, "layer_runs": 0, "layer_ok": 0})
    for row in rows:
        s = summary[row["scenario"]]
        s["runs"] += 1
        s["cause_ok"] += bool(row["cause_ok"])
        if row["layer_ok"] is not None:
            s["layer_runs"] += 1
            s["layer_ok"] += bool(row["layer_ok"])
    faults = [r for r in rows if r["scenario"] != "healthy"]
    layered = [r for r in faults if r["layer_ok"] is not None]
    totals = {"fault_runs": len(faults), "cause_accuracy": _share(sum(bool(r["cause_ok"]) for r in faults), len(faults)),
              "layer_runs": len(layered), "layer_accuracy": _share(sum(bool(r["layer_ok"]) for r in layered), len(layered)),
              "healthy_runs": sum(r["scenario"] == "healthy" for r in rows),
              "healthy_quiet": sum(bool(r["cause_ok"]) for r in rows if r["scenario"] == "healthy")}
    if args.json:
        print(json.dumps({"runs": rows, "per_scenario": summary, "totals": totals}, indent=1))
    else:
        print()
        for name, s in sorted(summary.items()):
            layer = f", layer {s['layer_ok']}/{s['layer_runs']}" if s["layer_runs"] else ""
            print(f"{name:<18} cause {s['cause_ok']}/{s['runs']}{layer}")
        print(json.dumps(totals))
    return 0


def _share(n: int, d: int) -> float | None:
    return round(n / d, 3) if d else None


if __name__ == "__main__":
    sys.exit(main())
