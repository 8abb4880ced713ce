"""``mltrace run [--config FILE] [--out-dir DIR] [hook options] (SCRIPT | -m MODULE) [ARGS...]``.

Validates the hook configuration, then replaces itself (``exec``) with the program: ``python
SCRIPT ARGS``, ``python -m MODULE ARGS``, or SCRIPT itself when it is a program on PATH or an
executable file that is not Python (``torchrun``, a shell script). Since mltrace's process is
gone, the script's exit code, output, exceptions, tracebacks, ``sys.argv`` and ``__main__`` are
exactly those of a plain run; every Python process of the job (the script, torchrun's workers,
multiprocessing's children) attaches through the bootstrap on PYTHONPATH (mltrace.launch.process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from mltrace.exceptions import MltraceError, MltraceValueError
from mltrace.launch import BOOTSTRAP_DIR
from mltrace.launch.config import RUN_CONFIG_ENV, merge_options, read_config_file, validate

EPILOG = """examples:
  mltrace run --config hook.json train.py --epochs 3
  mltrace run --out-dir /tmp/run1 --save-interval 10 --include-collections weights,gradients train.py
  mltrace run --config hook.json -m my_package.train
  mltrace run --config hook.json torchrun --nproc-per-node 2 train.py
  mltrace run --out-dir /tmp/run2 --save-interval 500 --flight-recorder-steps 100 train.py
The configuration is smdebug's JSON (LocalPath, HookParameters, CollectionConfigurations), from
--config or MLTRACE_CONFIG_FILE_PATH / SMDEBUG_CONFIG_FILE_PATH; options given here override it."""


def add_command(subparsers: Any) -> None:
    """Register ``mltrace run`` on the ``mltrace`` command's subparsers (as the other commands)."""
    run = subparsers.add_parser(
        "run", help="run an unmodified training script with a hook attached",
        description="Run a training script, unmodified, with an mltrace hook attached to "
                    "PyTorch, Keras, XGBoost or MXNet Gluon.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", help="smdebug's JSON hook configuration file")
    run.add_argument("--out-dir", help="the trial directory (overrides LocalPath)")
    run.add_argument("--save-interval", type=int, help="save every N steps")
    run.add_argument("--save-steps", help="save these steps, e.g. 1,2,3")
    run.add_argument("--include-collections", help="collections to save, e.g. weights,gradients")
    run.add_argument("--include-regex", help="regexes of tensor names to save too, comma-separated")
    run.add_argument("--reductions", help="save reductions instead of raw tensors, e.g. mean,l2")
    run.add_argument("--include-workers", choices=["one", "all"], help="which workers write")
    run.add_argument("--save-all", action="store_true", default=None, help="save every tensor")
    run.add_argument("--export-tensorboard", action="store_true", default=None,
                     help="also write TensorBoard summaries")
    run.add_argument("--flight-recorder", action="store_true", default=None,
                     help="keep the last steps' reductions in memory and write them to the trial "
                          "when a tensor turns NaN or infinite, the loss spikes, the script "
                          "raises or `mltrace dump` asks (see the --flight-recorder-* options)")
    run.add_argument("--flight-recorder-steps", type=int, metavar="N",
                     help="steps the flight recorder keeps (default 50); turns it on")
    run.add_argument("--flight-recorder-collections", metavar="A,B",
                     help="collections it records (default: those saved); turns it on")
    run.add_argument("--flight-recorder-reductions", metavar="A,B",
                     help="reductions it keeps of each tensor (default min,max,mean,std,l2; "
                          "min,max costs least); turns it on")
    run.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                     help="run a library module as a script, as python -m does")
    run.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                     help="the script (or a launcher on PATH such as torchrun) and its arguments")
    run.set_defaults(run=main)


def hook_parameters(args: argparse.Namespace) -> dict[str, str]:
    """HookParameters given on the command line, as strings (as SageMaker wrote them)."""
    params = {"save_interval": args.save_interval, "save_steps": args.save_steps,
              "include_regex": args.include_regex, "reductions": args.reductions,
              "include_workers": args.include_workers, "save_all": args.save_all,
              "export_tensorboard": args.export_tensorboard}
    return {k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in params.items() if v is not None}


def flight_recorder_options(args: argparse.Namespace) -> dict[str, str] | None:
    """The JSON configuration's FlightRecorder keys given on the command line (strings, as the
    file may hold them), or None if no option asks for a recorder."""
    given = {"steps": args.flight_recorder_steps, "collections": args.flight_recorder_collections,
             "reductions": args.flight_recorder_reductions}
    options = {k: str(v) for k, v in given.items() if v is not None}
    return options if options or args.flight_recorder else None


def program_argv(args: argparse.Namespace) -> list[str]:
    """The command line that replaces ``mltrace run``.

    Raises:
        MltraceValueError: no program, or a script that does not exist.
    """
    if args.module:
        return [sys.executable, "-m", *args.module]
    if not args.program:
        raise MltraceValueError("mltrace run needs a script: mltrace run [options] SCRIPT [ARGS] "
                                "(or -m MODULE [ARGS])")
    script, rest = args.program[0], args.program[1:]
    if os.path.isfile(script):
        if not script.endswith(".py") and os.access(script, os.X_OK) and _has_shebang(script):
            return [os.path.abspath(script), *rest]  # a console script, a shell script
        return [sys.executable, script, *rest]
    found = shutil.which(script) if os.sep not in script else None
    if found:
        return [found, *rest]
    raise MltraceValueError(
        f"script {script!r} does not exist (relative to {os.getcwd()}), and no program of that "
        "name is on PATH: check the path")


def _has_shebang(path: str) -> bool:
    """An executable file that names its interpreter (torchrun's console script, a shell
    script) runs through its own #! line."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def environment(doc: Mapping[str, object], base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the bootstrap first on PYTHONPATH and the configuration inline."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOTSTRAP_DIR, base.get("PYTHONPATH")) if p)
    env[RUN_CONFIG_ENV] = json.dumps(doc)
    return env


def main(args: argparse.Namespace) -> int:
    """Validate, then exec the program (returns only on an error: exit code 2)."""
    try:
        doc = read_config_file(args.config)
        collections = [c.strip() for c in (args.include_collections or "").split(",") if c.strip()]
        doc = merge_options(doc, args.out_dir, hook_parameters(args), collections,
                            flight_recorder_options(args))
        validate(doc, args.config or "the command line")
        argv = program_argv(args)
    except (MltraceError, FileNotFoundError) as exc:
        print(f"mltrace run: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, environment(doc, os.environ))
    return 0  # not reached
