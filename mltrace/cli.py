"""The ``mltrace`` command. Subcommands import what they need lazily.

    mltrace info TRIAL_DIR      collections, tensors and steps of a trial
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _info(args: argparse.Namespace) -> int:
    from mltrace.trials import create_trial

    trial = create_trial(args.trial, timeout=args.timeout)
    print(f"trial {trial.path}")
    print(f"  workers: {', '.join(trial.workers())}; training ended: {trial.loaded_all_steps}")
    for mode in trial.modes():
        steps = trial.steps(mode=mode)
        span = f"{steps[0]}..{steps[-1]}" if steps else "-"
        print(f"  {mode.name}: {len(steps)} steps ({span})")
    print("  collections:")
    for name, coll in sorted(trial.collections().items()):
        members = trial.tensor_names(collection=coll)
        print(f"    {name}: {len(members)} tensors, include_regex={coll.include_regex}")
    print("  tensors:")
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        steps = tensor.steps()
        print(f"    {name}: {len(steps)} steps")
    if trial.skipped_files:
        print(f"  skipped (damaged) index files: {', '.join(trial.skipped_files)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``mltrace`` command."""
    parser = argparse.ArgumentParser(prog="mltrace", description="Inspect and analyse mltrace/smdebug trials.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="summarise a trial: collections, tensors, steps per mode")
    info.add_argument("trial", help="the hook's out_dir")
    info.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the trial's first files")
    info.set_defaults(run=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mltrace`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except Exception as exc:  # a clear one-line error instead of a traceback
        from mltrace.exceptions import MltraceError

        if not isinstance(exc, MltraceError):
            raise
        print(f"mltrace: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
