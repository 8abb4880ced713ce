"""The ``mltrace`` command. Subcommands import what they need lazily.

Built in: ``info``, ``dump``, ``upload-spill``, ``run`` (mltrace.launch) and ``mcp``
(mltrace.mcp). Other packages add subcommands through the ``mltrace.commands`` entry-point
group (``mltrace.plugins.commands``): the MLflow side adds ``compare``, the TensorBoard plugin
``tensorboard``, mltrace.watch ``watch``:

    mltrace info TRIAL_DIR [--wait SECONDS]   collections, tensors and steps of a trial
    mltrace dump OUT_DIR [--reason TEXT]   ask the running job's hooks to dump their flight recorder
    mltrace run [--config FILE] [hook options] SCRIPT|-m MODULE [ARGS]   a script with a hook attached
    mltrace mcp [--root DIR_OR_S3]   an MCP server (stdio) through which AI agents read the trials
    mltrace compare [EXPERIMENT ...] [--filter F] [--tensor T] [--stat S]   MLflow runs side by side
    mltrace tensorboard DIR_OR_S3 [TENSORBOARD_ARGS]   TensorBoard with the mltrace tab on the trials
    mltrace watch LOCATION --rules RULES.json [--ray-address ADDR]   rules on every trial as it trains
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mltrace import plugins

if TYPE_CHECKING:
    from mltrace.analysis import StepSpan
    from mltrace.trials import Trial

logger = logging.getLogger(__name__)


def _info(args: argparse.Namespace) -> int:
    from mltrace.analysis import trial_overview
    from mltrace.trials import create_trial

    _check_exists(args.trial, args.wait)
    trial = create_trial(args.trial, timeout=args.wait)
    info = trial_overview(trial)
    print(f"trial {info.location}")
    print(f"  workers: {', '.join(info.workers)}; training ended: {info.ended}")
    for mode, span in info.modes.items():
        print(f"  {mode}: {span.count} steps ({_span_text(span)})")
    print("  collections:")
    for name, coll in info.collections.items():
        print(f"    {name}: {len(info.members[name])} tensors, include_regex={coll.include_regex}")
    print("  tensors:")
    for name in info.tensors:
        print(f"    {name}: {len(trial.tensor(name).steps())} steps")
    _print_flight_recorder(trial)
    if trial.skipped_files:
        print(f"  skipped (damaged) index files: {', '.join(trial.skipped_files)}")
    if info.ended:  # while training runs, an events file comes before its index
        orphans = _events_without_index(trial)
        if orphans:
            print(
                "  events files without an index file (not read; the index was lost): "
                + ", ".join(orphans)
            )
    return 0


def _print_flight_recorder(trial: Trial) -> None:
    """The first non-finite tensor and the flight recorder's dumps, when the trial has them."""
    from mltrace.format.flight_record import earliest_first_nonfinite

    records = trial.flight_records()
    first = earliest_first_nonfinite(records)
    if first is not None:
        print(f"  first non-finite tensor: {first.tensor} at step {first.step} "
              f"({first.mode} {first.mode_step}), {first.worker}, {first.phase} pass")
    for record in records:
        for dump in record.dumps:
            written = sorted({*dump.steps_before, *dump.steps_after})
            print(f"  flight recorder dump at step {dump.step} ({record.worker}): {dump.trigger}, "
                  f"{dump.reason or '-'}; {len(written)} steps written"
                  + (f" ({written[0]}..{written[-1]})" if written else ""))


def _check_exists(location: str, wait: float) -> None:
    """Fail at once on a local path that does not exist, unless the user asked to wait for it
    (a training job that has not created its out_dir yet).

    Raises:
        MltraceValueError: ``location`` is a missing local path and ``wait`` is 0.
    """
    from mltrace.exceptions import MltraceValueError
    from mltrace.storage import is_remote

    if wait > 0 or is_remote(location) or os.path.exists(location):
        return
    raise MltraceValueError(
        f"{location!r} does not exist: pass a hook's out_dir, or --wait SECONDS to wait for a "
        "training job that has not written its first step yet")


def _span_text(span: StepSpan) -> str:
    """``first..last`` of a span, ``-`` when it has no step."""
    return "-" if span.first is None else f"{span.first}..{span.last}"


def _events_without_index(trial: Trial) -> list[str]:
    """Events files of the trial that no index file names: the reader is index-driven, so their
    steps are invisible; ``mltrace info`` says so rather than let a step go missing silently."""
    from mltrace.format import paths

    indexed = {paths.parse_index_key(k) for k in trial.storage.list(paths.INDEX_DIR)}
    return [
        k
        for k in trial.storage.list(paths.EVENTS_DIR)
        if (parsed := paths.parse_event_key(k)) is not None and parsed not in indexed
    ]


def _dump(args: argparse.Namespace) -> int:
    """Write a flight recorder dump request into a running job's trial (as the
    ``dumpflightrecorder`` rule action does, with no rule)."""
    from mltrace.exceptions import MltraceValueError
    from mltrace.format import flight_record, paths
    from mltrace.storage import open_storage

    if "://" not in args.out_dir and not os.path.isdir(args.out_dir):
        raise MltraceValueError(
            f"{args.out_dir!r} is not a folder: pass the out_dir of a running hook")
    storage = open_storage(args.out_dir)
    if not storage.list(paths.COLLECTIONS_DIR):
        raise MltraceValueError(
            f"{args.out_dir!r} holds no trial (no collections file): pass the out_dir of a "
            "running hook")
    if storage.exists(paths.END_OF_JOB_MARKER):
        raise MltraceValueError(
            f"training at {args.out_dir!r} has ended (it wrote {paths.END_OF_JOB_MARKER}): no "
            "hook is left to dump; steps its recorder dumped are in the trial already")
    request = flight_record.write_request(storage, args.reason)
    print(f"asked the hooks writing {args.out_dir} to dump their flight recorder "
          f"(request {request.id}); each dumps once, when it next looks for requests")
    return 0


def _upload_spill(args: argparse.Namespace) -> int:
    from mltrace.writer.spill import upload_spill

    uploaded = upload_spill(args.folder)
    print(f"uploaded {uploaded} files from {args.folder}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``mltrace`` command."""
    parser = argparse.ArgumentParser(
        prog="mltrace", description="Inspect and analyse mltrace/smdebug trials.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="summarise a trial: collections, tensors, steps per mode")
    info.add_argument("trial", help="the hook's out_dir")
    info.add_argument("--wait", "--timeout", dest="wait", type=float, default=0.0,
                      metavar="SECONDS",
                      help="seconds to wait for the trial's first files (default 0: a missing "
                           "path fails at once)")
    info.set_defaults(run=_info)
    dump = sub.add_parser("dump", help="ask a running job's hooks to dump their flight recorder")
    dump.add_argument("out_dir", help="the running hook's out_dir (local path or s3://...)")
    dump.add_argument("--reason", default="requested with mltrace dump",
                      help="why, recorded with the dump (default: %(default)r)")
    dump.set_defaults(run=_dump)
    spill = sub.add_parser("upload-spill",
                           help="upload files a run kept on local disk while S3 was down")
    spill.add_argument("folder", help="the spill folder named in the run's log")
    spill.set_defaults(run=_upload_spill)
    from mltrace.diagnosis.command import add_command as add_diagnose  # mltrace diagnose
    from mltrace.launch.command import add_command as add_run  # mltrace run (zero script change)

    add_run(sub)
    add_diagnose(sub)
    from mltrace.mcp.command import add_command as add_mcp  # mltrace mcp (agents read trials)

    add_mcp(sub)
    for name, add_command in sorted(plugins.commands.items().items()):
        try:
            add_command(sub)
        except Exception as exc:  # a broken plugin must not take the built-in commands down
            logger.warning("mltrace command plugin %s could not add its subcommand: %s", name, exc)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mltrace`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # inside the try: a reader that went away fails here, not at exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except Exception as exc:  # a clear one-line error instead of a traceback
        from mltrace.exceptions import MltraceError

        if not isinstance(exc, MltraceError):
            raise
        print(f"mltrace: error: {exc}", file=sys.stderr)
        return 2


def _reader_gone() -> int:
    """Output piped into a reader that stopped early (``mltrace info ... | head``): end quietly,
    as a command killed by SIGPIPE does (exit 141), with no traceback and no second error when
    Python flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (a test's capture)
        pass
    return 128 + 13  # 128 + SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
