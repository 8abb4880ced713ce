"""Where rule executions run: a local process pool (this module) or a Ray cluster
(mltrace.watch.ray_executor). Both hand back a ``concurrent.futures.Future`` of the Outcome.

The pool's workers are spawned (no fork of a process holding boto3 and MLflow threads), reused
across executions, and die with the watcher (Linux ``PR_SET_PDEATHSIG``): a watcher killed with
SIGKILL leaves no worker that goes on writing to a rule run the restarted watcher resumes.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import signal
import sys
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from mltrace.watch.execution import Execution, run_execution
from mltrace.watch.state import Outcome

logger = logging.getLogger(__name__)


class Executor(Protocol):
    """Runs executions somewhere; ``live`` says the trial is still training."""

    #: for messages, e.g. "local pool of 2 processes"
    description: str

    def submit(self, execution: Execution, live: bool) -> Future[Outcome]: ...
    def release(self, execution: Execution) -> None: ...
    def shutdown(self) -> None: ...


def _die_with_parent() -> None:
    """Pool worker initializer: get SIGKILL when the watcher dies (Linux); quiet Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    from mltrace._logging import configure_from_env

    configure_from_env()


class LocalPoolExecutor:
    """A pool of ``processes`` spawned worker processes on this machine.

    Args:
        processes: the pool size (the scheduler never runs more executions at once).
    """

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.description = f"local pool of {processes} processes"
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_die_with_parent)

    def submit(self, execution: Execution, live: bool) -> Future[Outcome]:
        """Queue ``execution`` on the pool (a pool broken by a dead worker is replaced)."""
        try:
            return self._pool.submit(run_execution, execution)
        except BrokenProcessPool:
            logger.warning("the local pool lost a worker; starting a new pool")
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            return self._pool.submit(run_execution, execution)

    def release(self, execution: Execution) -> None:
        """Nothing to free: pool workers are reused."""

    def shutdown(self) -> None:
        """Stop the workers without waiting for running rules (they resume after a restart)."""
        # The stdlib pool keeps its processes in _processes; running rules would otherwise keep
        # the interpreter's exit waiting for them (a live trial's rule waits for steps).
        workers = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            proc.kill()


def create_executor(ray_address: str | None, max_concurrent: int,
                    ray_num_cpus: float = 0.5) -> Executor:
    """The Ray executor when ``ray_address`` is given, else a local pool of ``max_concurrent``.

    Raises:
        MltraceValueError: Ray is not installed; MltraceRuntimeError: the cluster cannot be
            reached (see mltrace.watch.ray_executor).
    """
    if ray_address:
        from mltrace.watch.ray_executor import RayExecutor

        return RayExecutor(ray_address, num_cpus=ray_num_cpus)
    return LocalPoolExecutor(max_concurrent)
