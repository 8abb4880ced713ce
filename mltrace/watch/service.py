"""The watch loop: find trials, decide which rules apply, hand executions to the scheduler.

Each poll lists the watched location for new trials (mltrace.watch.discovery), reads the
finished executions each new trial records (mltrace.watch.state), queues every configured rule
that applies (mltrace.watch.selection) and is not finished, and lets the scheduler start what
fits under the cap. A location that cannot be listed (S3 down) is logged and tried again at the
next poll, up to ``max_scan_failures`` polls in a row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mltrace.exceptions import MltraceRuntimeError
from mltrace.format import paths
from mltrace.watch import state
from mltrace.watch.discovery import FoundTrial, TrialFinder
from mltrace.watch.execution import Execution
from mltrace.watch.scheduling import Scheduler
from mltrace.watch.selection import TagSource, selects
from mltrace.watch.spec import WatchRule
from mltrace.watch.storage_cache import StorageCache

logger = logging.getLogger(__name__)


@dataclass
class _TrialState:
    trial: FoundTrial
    finished: set[str]
    #: rule keys whose selection is not decided yet (waiting for the MLflow run file)
    undecided: set[str]
    ended: bool = False


@dataclass
class WatchStats:
    """What a watcher did (for logs, tests and the benchmark)."""

    trials: int = 0
    started: int = 0
    outcomes: list[state.Outcome] = field(default_factory=list)


class Watcher:
    """Runs the configured rules on every trial below ``location``.

    Args:
        location: a local folder or ``s3://bucket/prefix``.
        rules: the configured rules (mltrace.watch.spec.load_watch_rules).
        scheduler: the cap and the executor.
        poll_interval: seconds between polls.
        trial_wait, deletion_check: see mltrace.watch.execution.Execution.
        max_scan_failures: polls in a row that may fail to list ``location`` before run() gives up.
        diagnose: diagnose a trial that shows trouble after its rules ran
            (mltrace.watch.diagnosis; ``--no-diagnose`` makes it False).
    """

    def __init__(self, location: str, rules: Sequence[WatchRule], scheduler: Scheduler,
                 poll_interval: float = 5.0, trial_wait: float = 30.0,
                 deletion_check: float = 5.0, max_scan_failures: int = 60,
                 diagnose: bool = True) -> None:
        self.location = location
        self.rules = list(rules)
        self.scheduler = scheduler
        self.poll_interval = poll_interval
        self.trial_wait = trial_wait
        self.deletion_check = deletion_check
        self.max_scan_failures = max_scan_failures
        self.diagnose = diagnose
        self.storages = StorageCache()
        self.finder = TrialFinder(location, storages=self.storages)
        self.tags = TagSource(self.storages)
        self.stats = WatchStats()
        self._trials: dict[str, _TrialState] = {}
        self._scan_failures = 0

    def poll(self) -> list[state.Outcome]:
        """One round: scan, queue, start what fits, collect what ended.

        Raises:
            MltraceRuntimeError: the location could not be listed ``max_scan_failures`` times
                in a row.
        """
        try:
            found = self.finder.scan()
            self._scan_failures = 0
        except Exception as exc:
            self._scan_failures += 1
            logger.warning("cannot list %s (%s: %s); trying again in %.0f s (%d of %d)",
                           self.location, type(exc).__name__, exc, self.poll_interval,
                           self._scan_failures, self.max_scan_failures)
            if self._scan_failures >= self.max_scan_failures:
                raise MltraceRuntimeError(
                    f"cannot list {self.location} after {self._scan_failures} tries: {exc}"
                ) from exc
            found = []
        for trial in found:
            if trial.relative not in self._trials:
                self._add_trial(trial)
        for ts in self._trials.values():
            if ts.undecided:
                self._queue(ts, [r for r in self.rules if r.key in ts.undecided])
        outcomes = self.scheduler.pump()
        for outcome in outcomes:
            self._report(outcome)
        return outcomes

    def _add_trial(self, trial: FoundTrial) -> None:
        try:
            finished = state.finished_keys(trial.location, self.storages.get(trial.location))
        except Exception as exc:
            logger.warning("cannot read the watch state of %s (%s); next poll", trial.location,
                           exc)
            self.finder.forget(trial.relative)
            return
        ts = _TrialState(trial, finished, undecided=set())
        self._trials[trial.relative] = ts
        self.stats.trials += 1
        todo = [r for r in self.rules if r.key not in finished]
        logger.info("found trial %s: %d rules finished before, %d to consider", trial.location,
                    len(self.rules) - len(todo), len(todo))
        self._queue(ts, todo)

    def _queue(self, ts: _TrialState, rules: Sequence[WatchRule]) -> None:
        live = None
        for rule in rules:
            verdict = selects(rule.selector, ts.trial, self.tags)
            if verdict is None:
                ts.undecided.add(rule.key)
                continue
            ts.undecided.discard(rule.key)
            if not verdict or self.scheduler.has(ts.trial.location, rule.key):
                continue
            if live is None:
                live = not self.storages.get(ts.trial.location).exists(paths.END_OF_JOB_MARKER)
            self.scheduler.add(Execution(ts.trial.location, rule, self.trial_wait,
                                         self.deletion_check, self.diagnose), live=live)
            self.stats.started += 1

    def _report(self, outcome: state.Outcome) -> None:
        self.stats.outcomes.append(outcome)
        if outcome.status == state.DELETED:
            logger.warning("%s on %s: the trial was deleted; %d steps evaluated were kept in "
                           "MLflow run %s", outcome.rule, outcome.trial, outcome.evaluated_steps,
                           outcome.mlflow_run_id)
            rel = next((r for r, t in self._trials.items() if t.trial.location == outcome.trial),
                       None)
            self.storages.forget(outcome.trial)
            if rel is not None:
                self.finder.forget(rel)
                del self._trials[rel]
            return
        level = logging.INFO if outcome.status == state.FINISHED else logging.ERROR
        logger.log(level, "%s on %s: %s (%s; %d steps, fired at %d; MLflow run %s%s)%s",
                   outcome.rule, outcome.trial, outcome.status, outcome.rule_status,
                   outcome.evaluated_steps, len(outcome.fired_steps), outcome.mlflow_run_id,
                   f"; diagnosis: {outcome.diagnosis}" if outcome.diagnosis else "",
                   f": {outcome.error}" if outcome.error else "")

    def done(self) -> bool:
        """True when nothing runs or waits, no selection is pending and every trial found has
        ended (what ``--exit-when-done`` waits for)."""
        if not self.scheduler.idle:
            return False
        for ts in self._trials.values():
            if ts.undecided:
                return False
            if not ts.ended:
                ts.ended = self.storages.get(ts.trial.location).exists(paths.END_OF_JOB_MARKER)
                if not ts.ended:
                    return False
        return True

    def run(self, exit_when_done: bool = False, stop: threading.Event | None = None,
            on_poll: Callable[[Watcher], None] | None = None) -> WatchStats:
        """Poll until ``stop`` is set (or, with ``exit_when_done``, until done()); then stop
        the executor. Returns the stats."""
        stop = stop or threading.Event()
        try:
            while not stop.is_set():
                started = time.monotonic()
                self.poll()
                if on_poll is not None:
                    on_poll(self)
                if exit_when_done and self._trials and self.done():
                    break
                left = max(0.0, self.poll_interval - (time.monotonic() - started))
                running, waiting = self.scheduler.counts
                if running:  # wake up as soon as one ends, to start the next in line
                    self.scheduler.wait(min(left, 1.0) if waiting else left)
                    if waiting:
                        continue
                    left = max(0.0, self.poll_interval - (time.monotonic() - started))
                stop.wait(left)
        finally:
            self.scheduler.shutdown()
        return self.stats
