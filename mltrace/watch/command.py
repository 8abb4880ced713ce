"""``mltrace watch LOCATION --rules RULES.json``: rules as a service over every trial below a
folder or S3 prefix (registered through the ``mltrace.commands`` entry-point group).

Defining the arguments imports nothing heavy; Ray is imported only with ``--ray-address``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any


def add_command(subparsers: Any) -> None:
    """Add ``watch`` to the ``mltrace`` command's subparsers."""
    watch = subparsers.add_parser(
        "watch", help="run rules on every trial below a folder or S3 prefix, as they train",
        description="Find trials as they appear below LOCATION, run the configured rules on each "
                    "while it trains (each rule execution an MLflow run nested under the trial's "
                    "training run), in a local process pool or on a Ray cluster. Restart-safe: "
                    "finished executions are recorded in the trials.")
    watch.add_argument("location", help="a local folder or s3://bucket/prefix")
    watch.add_argument("--rules", required=True,
                       help="RULES.json: the rule CLI's rules_specification list, each entry "
                            "with an optional \"Trials\" (a glob over trial paths, or "
                            "{\"PathGlob\": ..., \"MlflowTags\": {...}}) and optional "
                            "\"Actions\" (as --action-str: stoptraining, dumpflightrecorder, "
                            "notify)")
    watch.add_argument("--ray-address", default=None,
                       help="run rules on this Ray cluster: auto, HOST:PORT or ray://HOST:PORT "
                            "(default: a local process pool)")
    watch.add_argument("--max-concurrent", type=int, default=4,
                       help="rule executions at once; the others wait in order (default 4)")
    watch.add_argument("--ray-num-cpus", type=float, default=0.5,
                       help="CPUs Ray reserves per rule execution (default 0.5)")
    watch.add_argument("--poll-interval", type=float, default=5.0,
                       help="seconds between looks for new trials (default 5)")
    watch.add_argument("--trial-wait", type=float, default=30.0,
                       help="seconds a rule waits for a new trial's first files (default 30)")
    watch.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                       help="do not diagnose a trial that shows trouble (a flight-recorder dump, "
                            "a rule that fired) after its rules ran (default: diagnose it once, "
                            "into its mltrace_diagnosis/, the log and MLflow)")
    watch.add_argument("--exit-when-done", action="store_true",
                       help="exit once every trial found has ended and its rules are done")
    watch.add_argument("--log-level", default="INFO", help="default INFO")
    watch.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from mltrace.watch.executors import create_executor
    from mltrace.watch.scheduling import Scheduler
    from mltrace.watch.service import Watcher
    from mltrace.watch.spec import load_watch_rules

    _configure_logging(args.log_level)
    log = logging.getLogger("mltrace.watch")
    rules = load_watch_rules(args.rules)  # every mistake in RULES.json before anything starts
    executor = create_executor(args.ray_address, args.max_concurrent, args.ray_num_cpus)
    watcher = Watcher(args.location, rules, Scheduler(executor, args.max_concurrent),
                      poll_interval=args.poll_interval, trial_wait=args.trial_wait,
                      diagnose=args.diagnose)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("watching %s with %d rules (%s) on %s, at most %d at once%s", args.location,
             len(rules), ", ".join(r.key for r in rules), executor.description,
             args.max_concurrent, "" if args.diagnose else "; no diagnoses")
    stats = watcher.run(exit_when_done=args.exit_when_done, stop=stop)
    failed = sum(o.status == "failed" for o in stats.outcomes)
    log.info("stopped: %d trials, %d rule executions ended (%d failed)", stats.trials,
             len(stats.outcomes), failed)
    return 0


def _configure_logging(level: str) -> None:
    logger = logging.getLogger("mltrace")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s"))
        logger.addHandler(handler)
