"""``mltrace tensorboard DIR_OR_S3``: find the trials, then start TensorBoard with everything set.

TensorBoard's loader must never walk into a trial's ``events/`` (it would make one run per step
and reject smdebug's fixed CRC), so ``--logdir`` gets the trials' ``tensorboard/`` exports only:

* one local trial: ``--logdir <trial>/tensorboard``;
* several local trials: a temporary folder of links ``<name> -> <trial>/tensorboard`` (both of
  TensorBoard's loaders follow links, so ``--load_fast`` stays available), removed at exit;
* ``--print-command``: no folder at all, as the printed command outlives this process: the
  trials' ``tensorboard/`` paths (``--logdir`` for one, ``--logdir_spec name:path,...`` for
  several, which TensorBoard reads with its Python loader), a missing one simply showing nothing;
* remote (s3://): ``--logdir`` (one trial) or ``--logdir_spec name:uri,...``, the Python loader
  (the only one that reads S3), ``S3_ENDPOINT`` from ``AWS_ENDPOINT_URL`` for S3-compatible
  servers, and TensorBoard's own TensorFlow stub, whose S3 file system uses boto3 (TensorFlow's
  gfile dropped S3 support).

The plugin gets ``--mltrace_logdir DIR_OR_S3`` and reads the trials themselves. Scalars are kept
whole up to 100,000 steps (``--samples_per_plugin scalars=100000``; a 0, TensorBoard's "all",
makes 2.21's scalars dashboard draw nothing); histograms keep TensorBoard's sampling (a point
costs ~700 bytes per tensor) unless you pass your own ``--samples_per_plugin``, e.g.
``scalars=100000,histograms=20000``. The mltrace tab itself always reads every step from the trial.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from mltrace.exceptions import MltraceValueError
from mltrace.format import paths
from mltrace.storage import is_remote

from . import discovery, metadata

logger = logging.getLogger(__name__)

#: Keep up to 100k steps of every scalar series. Not 0 ("all"): TensorBoard 2.21's scalars
#: dashboard then asks its data provider for 0 points and draws nothing.
DEFAULT_SAMPLES = "scalars=100000"


@dataclass
class Launch:
    """What ``mltrace tensorboard`` runs: TensorBoard's arguments, extra environment, the trials."""

    argv: list[str]
    env: dict[str, str]
    trials: list[tuple[str, str]]
    stub_tensorflow: bool = False
    cleanup: list[str] = field(default_factory=list)


def _has_export(location: str) -> bool:
    if is_remote(location):
        return True
    return os.path.isdir(os.path.join(location, paths.TENSORBOARD_DIR))


def build_launch(
    target: str, extra: list[str] | None = None, environ: dict[str, str] | None = None,
    make_folders: bool = True,
) -> Launch:
    """Find the trials under ``target`` and build TensorBoard's command line.

    ``make_folders=False`` (a printed command) makes no temporary folder: the trials' export
    paths are passed as they are, whether they exist or not (see the module's docstring).

    Raises:
        MltraceValueError: no trial under ``target``.
    """
    extra = list(extra or [])
    environ = dict(os.environ if environ is None else environ)
    trials = discovery.find_trials(target)
    if not trials:
        raise MltraceValueError(
            f"no mltrace trial under {target!r} "
            "(a trial holds collections/000000000/*_collections.json): "
            "pass a hook's out_dir or a folder of them"
        )
    remote = is_remote(target)
    names = [_run_name(rel, loc) for rel, loc in trials]
    exports = [
        (n, f"{loc.rstrip('/')}/{paths.TENSORBOARD_DIR}")
        for n, (_, loc) in zip(names, trials)
        if _has_export(loc) or not make_folders
    ]
    launch = Launch(argv=[], env={}, trials=trials, stub_tensorflow=remote)
    if remote:
        if len(exports) == 1:
            logdir_args = ["--logdir", exports[0][1]]
        elif exports:
            logdir_args = [
                "--logdir_spec",
                ",".join(f"{_spec_name(n)}:{uri}" for n, uri in exports),
            ]
        else:
            logdir_args = ["--logdir", _empty_dir(launch)]
        logdir_args.append("--load_fast=false")
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        if endpoint and not environ.get("S3_ENDPOINT"):
            launch.env["S3_ENDPOINT"] = endpoint
    elif len(trials) == 1:
        logdir_args = ["--logdir", exports[0][1] if exports else _empty_dir(launch)]
    elif not make_folders:
        logdir_args = ["--logdir_spec", ",".join(f"{_spec_name(n)}:{os.path.abspath(e)}" for n, e in exports)]
    else:
        logdir_args = ["--logdir", _link_farm(launch, exports)]
    if not any(a.startswith("--samples_per_plugin") for a in extra):
        logdir_args += ["--samples_per_plugin", DEFAULT_SAMPLES]
    launch.argv = [*logdir_args, f"--{metadata.LOGDIR_FLAG}", target, *extra]
    return launch


def _run_name(rel: str, location: str) -> str:
    return rel or location.rstrip("/").rsplit("/", 1)[-1]


def _spec_name(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def _empty_dir(launch: Launch) -> str:
    folder = tempfile.mkdtemp(prefix="mltrace-tb-")
    launch.cleanup.append(folder)
    return folder


def _link_farm(launch: Launch, exports: list[tuple[str, str]]) -> str:
    """A folder of links to the exports, named like the trials (nested names keep their folders)."""
    farm = _empty_dir(launch)
    for name, export in exports:
        link = os.path.join(farm, *name.split("/"))
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.abspath(export), link, target_is_directory=True)
    return farm


def run_tensorboard(argv: list[str], stub_tensorflow: bool = False) -> None:
    """Run TensorBoard in this process (``python -m mltrace_tb.launch [--stub-tensorflow] ARGS``)."""
    if stub_tensorflow:
        import types

        # TensorBoard uses its own TensorFlow stub when this module exists (its no-TF build marker).
        sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
    from tensorboard import main as tb_main

    sys.argv = ["tensorboard", *argv]
    tb_main.run_main()


def run_cli(args: argparse.Namespace) -> int:
    """``mltrace tensorboard``: print what was found, then run TensorBoard until it exits."""
    extra = list(args.tensorboard_args or [])
    launch = build_launch(
        args.target, [a for a in extra if a != "--"] if "--" in extra[:1] else extra,
        make_folders=not args.print_command,  # a printed command outlives this process
    )
    for folder in launch.cleanup:
        atexit.register(shutil.rmtree, folder, True)
    print(f"mltrace: {len(launch.trials)} trial(s) under {args.target}:", file=sys.stderr)
    for rel, location in launch.trials:
        print(f"  {rel or '.'}  ({location})", file=sys.stderr)
    command = [
        sys.executable,
        "-m",
        "mltrace_tb.launch",
        *(["--stub-tensorflow"] if launch.stub_tensorflow else []),
        *launch.argv,
    ]
    if args.print_command:
        env = " ".join(f"{k}={v}" for k, v in launch.env.items())
        print((env + " " if env else "") + " ".join(command))
        return 0
    return run_child(command, {**os.environ, **launch.env})


#: Seconds TensorBoard gets to stop after a signal was passed on, before SIGTERM, then as many
#: before SIGKILL (TensorBoard busy loading a trial can miss a SIGINT).
STOP_GRACE = 10.0


def run_child(command: list[str], env: dict[str, str]) -> int:
    """Run TensorBoard as a child and wait for it; SIGTERM, SIGINT and SIGHUP sent to this process
    are passed on to it, so that stopping ``mltrace tensorboard`` stops TensorBoard and frees its
    port (instead of leaving an orphan behind); one that still runs STOP_GRACE seconds later gets
    SIGTERM, then SIGKILL. On Linux the child also gets SIGTERM if this
    process dies without forwarding (SIGKILL). Returns the child's exit code (0 when TensorBoard
    shut down cleanly on the signal; 128 + signal number when the signal killed it, as a shell
    reports it)."""
    proc = subprocess.Popen(command, env=env, preexec_fn=_die_with_parent)
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    wanted = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    previous = {s: signal.signal(s, forward) for s in wanted}
    escalation = [signal.SIGTERM, signal.SIGKILL]
    deadline: float | None = None
    try:
        while True:  # short waits: a blocking one resumes after the handler, deaf to the grace
            try:
                code = proc.wait(0.25)
                break
            except KeyboardInterrupt:  # a handler that was not ours ran: pass it on and wait
                forward(signal.SIGINT, None)
            except subprocess.TimeoutExpired:
                if not forwarded or not escalation:
                    continue
                if deadline is None:
                    deadline = time.monotonic() + STOP_GRACE
                elif time.monotonic() >= deadline:  # asked to stop and still running: insist
                    sig = escalation.pop(0)
                    logger.warning("mltrace tensorboard: TensorBoard did not stop within %g s of signal "
                                   "%d; sending %s", STOP_GRACE, forwarded[0], sig.name)
                    proc.send_signal(sig)
                    deadline = time.monotonic() + STOP_GRACE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if forwarded:
        logger.info("mltrace tensorboard: passed signal %d on; TensorBoard exited with %d",
                    forwarded[0], code)
    return 128 - code if code < 0 else code


def _die_with_parent() -> None:
    """In the child before exec: ask Linux for SIGTERM when the parent dies (prctl
    PR_SET_PDEATHSIG); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    _args = sys.argv[1:]
    _stub = bool(_args) and _args[0] == "--stub-tensorflow"
    run_tensorboard(_args[1:] if _stub else _args, stub_tensorflow=_stub)
