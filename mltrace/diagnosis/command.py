"""``mltrace diagnose TRIAL [--step S] [--json]``: why a run broke (mltrace.diagnosis).

Exit codes: 0 when the report was made (an anomaly explained, or none found: the report says so
with the thresholds used), 2 when the trial cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EPILOG = """examples:
  mltrace diagnose /tmp/run1
  mltrace diagnose /tmp/run1 --step 412 --json
  mltrace diagnose s3://bucket/runs/run1 --json > diagnosis.json
The method and every field of the JSON: docs/guide/diagnose.md."""


def add_command(subparsers: Any) -> None:
    """Register ``mltrace diagnose`` on the ``mltrace`` command's subparsers."""
    cmd = subparsers.add_parser(
        "diagnose", help="why did the run break: onset, origin and cause of its first anomaly",
        description="Find a trial's first anomaly (or explain --step), the step and the tensor where "
                    "it began, and its likely cause with the evidence.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.add_argument("trial", help="the hook's out_dir (local path or s3://...)")
    cmd.add_argument("--step", type=int, help="explain this global step instead of the first anomaly")
    cmd.add_argument("--worker", help="the worker whose tensors to read (default: the trial's first)")
    cmd.add_argument("--json", action="store_true", help="print the report as JSON (schema mltrace.diagnosis/1)")
    cmd.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from mltrace.diagnosis import diagnose
    from mltrace.exceptions import MltraceValueError
    from mltrace.trials import create_trial

    try:
        report = diagnose(create_trial(args.trial, timeout=0), args.step, worker=args.worker)
    except MltraceValueError as exc:
        print(f"mltrace diagnose: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.to_text())
    return 0
