"""Back-pressure: at most ``max_concurrent`` rule executions at once, the others wait in the
order they were found; failures of the machinery (a trial that cannot be opened yet, a pool or
Ray worker that died) are retried a bounded number of times, each logged.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from mltrace.exceptions import MltraceValueError
from mltrace.watch import state
from mltrace.watch.execution import Execution
from mltrace.watch.executors import Executor

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    execution: Execution
    live: bool
    attempts: int = 0
    not_before: float = 0.0


class Scheduler:
    """A FIFO of executions in front of an executor, with a cap on running ones.

    Args:
        executor: where executions run.
        max_concurrent: the cap (>= 1).
        max_attempts: tries per execution when the machinery fails (not when the rule fails).
        retry_delay: seconds before a retry.
    """

    def __init__(self, executor: Executor, max_concurrent: int, max_attempts: int = 3,
                 retry_delay: float = 10.0) -> None:
        if max_concurrent < 1:
            raise MltraceValueError(f"--max-concurrent {max_concurrent}: must be 1 or more")
        self.executor = executor
        self.max_concurrent = max_concurrent
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self._waiting: deque[_Job] = deque()
        self._running: dict[tuple[str, str], tuple[_Job, Future[state.Outcome]]] = {}
        self._known: set[tuple[str, str]] = set()

    def add(self, execution: Execution, live: bool) -> None:
        """Queue ``execution`` (once: an execution already queued or running is ignored)."""
        ident = (execution.trial, execution.key)
        if ident in self._known:
            return
        self._known.add(ident)
        self._waiting.append(_Job(execution, live))

    def has(self, trial: str, key: str) -> bool:
        """True if the execution was queued (it may have ended since)."""
        return (trial, key) in self._known

    @property
    def idle(self) -> bool:
        """True when nothing waits or runs."""
        return not self._waiting and not self._running

    @property
    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        return len(self._running), len(self._waiting)

    def pump(self) -> list[state.Outcome]:
        """Collect what ended, start what fits under the cap; the outcomes that ended."""
        ended: list[state.Outcome] = []
        for ident, (job, future) in list(self._running.items()):
            if not future.done():
                continue
            del self._running[ident]
            self.executor.release(job.execution)
            outcome = self._outcome(job, future)
            if outcome is not None:
                ended.append(outcome)
        now = time.monotonic()
        skipped: list[_Job] = []
        while self._waiting and len(self._running) < self.max_concurrent:
            job = self._waiting.popleft()
            if job.not_before > now:
                skipped.append(job)
                continue
            job.attempts += 1
            logger.info("starting %s (%s, attempt %d; %d running, %d waiting)",
                        job.execution.name, "live" if job.live else "finished trial",
                        job.attempts, len(self._running) + 1, len(self._waiting))
            future = self.executor.submit(job.execution, job.live)
            self._running[(job.execution.trial, job.execution.key)] = (job, future)
        self._waiting.extendleft(reversed(skipped))  # their place in the line is kept
        return ended

    def _outcome(self, job: _Job, future: Future[state.Outcome]) -> state.Outcome | None:
        """The outcome, or None when the execution was queued again for a retry."""
        try:
            outcome = future.result()
        except Exception as exc:  # a pool worker or Ray worker died under the rule
            why = f"{type(exc).__name__}: {str(exc)[:500]}"
            outcome = state.Outcome(job.execution.trial, job.execution.key,
                                    job.execution.rule.name, state.UNAVAILABLE, error=why)
        if outcome.status != state.UNAVAILABLE:
            return outcome
        if job.attempts < self.max_attempts:
            logger.warning("%s could not run (%s); trying again in %.0f s (attempt %d of %d)",
                           job.execution.name, outcome.error, self.retry_delay,
                           job.attempts + 1, self.max_attempts)
            job.not_before = time.monotonic() + self.retry_delay
            self._waiting.append(job)
            return None
        logger.error("%s could not run after %d attempts: %s; it runs again when the watcher "
                     "restarts", job.execution.name, job.attempts, outcome.error)
        return outcome

    def wait(self, timeout: float) -> None:
        """Block until a running execution ends or ``timeout`` seconds pass."""
        futures = [future for _, future in self._running.values()]
        if futures:
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    def shutdown(self) -> None:
        """Stop the executor (running rules resume when a watcher starts again)."""
        self.executor.shutdown()
