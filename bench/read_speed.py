"""Time to open a trial and to read every saved value of every weight tensor, mltrace or smdebug.

Runs in either venv (.venv: mltrace; .venv-legacy: mltrace, smdebug). The trial is a finished run
(``training_job_end.ts`` present), e.g. the 500-step, save-every-step run that
bench/run_pytorch.py writes with ``pytorch_overhead.py --write-trial``.

One run, on a freshly created trial object (no value cache carried over):
  1. ``create_trial(path)``                                     -> ``create_s``
  2. ``trial.tensor_names(collection="weights")`` and, for each name, ``trial.tensor(name).steps()``
     (smdebug's first listing of a finished job holds its fixed ~1 s end-of-training re-read)
                                                                -> ``list_s``
  3. ``tensor.value(step)`` for every weight tensor and every step -> ``per_value_ms`` (mean)
``open_s`` = create_s + list_s: everything before the first value.

Protocol (bench/protocol.py): one warm-up run and ``--runs`` measured runs, medians
reported. The OS page cache is warm after the warm-up for either library alike.

Examples:
    .venv/bin/python bench/read_speed.py --lib mltrace --trial /tmp/t_mltrace
    .venv-legacy/bin/python bench/read_speed.py --lib smdebug --trial /tmp/t_mltrace --json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np

import protocol

LIBS = ("mltrace", "smdebug")


def import_create_trial(lib: str) -> Any:
    if lib == "mltrace":
        from mltrace.trials import create_trial
    elif lib == "smdebug":
        from smdebug.trials import create_trial  # type: ignore[no-redef]
    else:
        raise SystemExit(f"--lib {lib!r}: choose from {', '.join(LIBS)}")
    return create_trial


def one_run(create_trial: Any, path: str) -> dict[str, Any]:
    gc.collect()
    t0 = time.perf_counter()
    trial = create_trial(path)
    t1 = time.perf_counter()
    names = trial.tensor_names(collection="weights")
    plan = [(name, trial.tensor(name)) for name in names]
    plan = [(name, tensor, list(tensor.steps())) for name, tensor in plan]
    t2 = time.perf_counter()
    values = []
    for _name, tensor, steps in plan:
        for step in steps:
            values.append(tensor.value(step))
    t3 = time.perf_counter()
    n = len(values)
    # Checked outside the timed region: what was read, so that readers can be compared.
    checksum = float(sum(np.asarray(v, dtype=np.float64).sum() for v in values))
    return {
        "create_s": t1 - t0,
        "list_s": t2 - t1,
        "open_s": t2 - t0,
        "values_s": t3 - t2,
        "per_value_ms": (t3 - t2) * 1000.0 / n if n else None,
        "n_values": n,
        "tensors": names,
        "steps_per_tensor": [len(s) for _n, _t, s in plan],
        "checksum": checksum,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", required=True, choices=LIBS)
    parser.add_argument("--trial", required=True, help="a finished trial directory")
    parser.add_argument("--runs", type=int, default=5, help="measured runs (after one warm-up)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.trial):
        parser.error(f"--trial {args.trial}: not a directory")
    if args.runs < 1:
        parser.error("--runs must be >= 1")

    create_trial = import_create_trial(args.lib)
    protocol.warn_if_busy()
    machine = protocol.machine()
    measured = protocol.interleaved(
        {args.lib: functools.partial(one_run, create_trial, args.trial)}, args.runs)[args.lib]
    warmup, runs = measured.warmup, measured.runs
    if not warmup["n_values"]:
        raise SystemExit(f"{args.lib} read no weight values from {args.trial}")

    def med(key: str) -> float:
        return protocol.pick({args.lib: measured}, key)[args.lib].median

    module = __import__(args.lib)
    report = {
        "lib": args.lib,
        "version": getattr(module, "__version__", None),
        "trial": os.path.abspath(args.trial),
        "runs": args.runs,
        "create_s": med("create_s"),
        "list_s": med("list_s"),
        "open_s": med("open_s"),
        "per_value_ms": med("per_value_ms"),
        "runs_per_value_ms": [r["per_value_ms"] for r in runs],
        "runs_open_s": [r["open_s"] for r in runs],
        "warmup_per_value_ms": warmup["per_value_ms"],
        "n_values": warmup["n_values"],
        "tensors": warmup["tensors"],
        "steps_per_tensor": warmup["steps_per_tensor"],
        "checksum": warmup["checksum"],
        "env": {
            "python": machine["python"],
            "executable": machine["executable"],
            "numpy": np.__version__,
            "machine": machine,
        },
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.lib} reading {args.trial}: {report['n_values']} values of {report['tensors']}"
        )
        print(
            f"  create_trial {report['create_s']:.3f} s, listing {report['list_s']:.3f} s, "
            f"open total {report['open_s']:.3f} s"
        )
        print(
            f"  {report['per_value_ms']:.4f} ms/value (median of {args.runs}: "
            + ", ".join(f"{v:.4f}" for v in report["runs_per_value_ms"])
            + ")"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
