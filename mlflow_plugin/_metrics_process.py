"""The helper process that sends a sink's metric batches to MLflow.

Why a process: MLflow's client (the SQLAlchemy store above all) spends about 0.1 ms of pure
Python per metric, and a background thread doing that holds the GIL the training thread needs.
In a process of its own that work costs the training process nothing but a pipe write.

Protocol: ``python -m`` this module ``RUN_ID TRACKING_URI``; stdin carries one JSON
line per batch, ``[[key, value, timestamp_ms, step], ...]``; at end of input the process prints
one JSON line on stdout, ``{"logged": n, "failed": n, "error": first error or null}``, and exits.
It never raises: a batch MLflow refuses is counted and reported in that line. It runs at a lower
CPU priority (nice +10) than the training process.
"""

from __future__ import annotations

import json
import logging
import os
import sys


def _serve(run_id: str, tracking_uri: str) -> dict:
    try:  # background work: when CPUs are short, the training process goes first
        os.nice(10)
    except (AttributeError, OSError):
        pass
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=tracking_uri)
    logged = failed = 0
    error = None
    try:  # open the store now (engine, schema check), not during the first batch
        client.get_run(run_id)
    except Exception:  # the first batch will fail and say why
        pass
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            batch = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in json.loads(line)]
            for i in range(0, len(batch), 1000):
                client.log_batch(run_id, metrics=batch[i:i + 1000], synchronous=True)
            logged += len(batch)
        except Exception as exc:  # report, keep serving
            failed += 1
            error = error or f"{type(exc).__name__}: {exc}"
    return {"logged": logged, "failed": failed, "error": error}


def main(argv: list[str]) -> int:
    """Serve batches for run ``argv[0]`` at tracking URI ``argv[1]`` until stdin closes."""
    try:
        summary = _serve(argv[0], argv[1])
    except Exception as exc:
        summary = {"logged": 0, "failed": -1, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
    # Every batch was logged synchronously and the summary is out: skip interpreter teardown
    # (MLflow's and SQLAlchemy's exit handlers take seconds), the hook's close waits for this exit.
    # os._exit is the standard library's documented exit without clean-up; nothing else skips it.
    sys.stdout.flush()
    os._exit(0)
