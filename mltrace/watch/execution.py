"""One rule execution on one trial: what a pool worker or a Ray task runs.

``run_execution`` opens the trial, builds the rule and runs ``invoke_rule`` with no end step, so
it follows the trial while it trains and returns when training ends (the live path of the rule
CLI); then, with ``diagnose``, a trial that shows trouble is diagnosed where it was read
(mltrace.watch.diagnosis). The MLflow listener gets the execution key, so that a run an earlier,
interrupted attempt created is resumed rather than duplicated. It never raises: a rule that
crashes, a trial that cannot be opened or disappears is an Outcome (and, for a crash, a FAILED
MLflow run with the traceback as an artifact), so that one bad rule never stops the others.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from mltrace.exceptions import NoMoreData
from mltrace.format import paths
from mltrace.rules import results
from mltrace.watch import state
from mltrace.watch.diagnosis import diagnose_trouble
from mltrace.watch.spec import WatchRule

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Execution:
    """A rule to run on a trial (picklable: it travels to pool workers and Ray tasks).

    Args:
        trial: the trial's location.
        rule: the configured rule.
        trial_wait: seconds to wait for the trial's first files.
        deletion_check: seconds between checks that the trial still exists.
        diagnose: after the rule, diagnose the trial if it shows trouble
            (mltrace.watch.diagnosis; ``mltrace watch --no-diagnose`` turns it off).
    """

    trial: str
    rule: WatchRule
    trial_wait: float = 30.0
    deletion_check: float = 5.0
    diagnose: bool = True

    @property
    def key(self) -> str:
        """The execution key: the rule configuration's key (unique within a trial)."""
        return self.rule.key

    @property
    def name(self) -> str:
        """For messages: ``Rule on trial``."""
        return f"{self.rule.name} on {self.trial}"


class _DeletionWatch:
    """Ends the rule's wait for steps when the trial's collections file disappears (the trial
    was deleted): the reader is told that no step will come, so invoke_rule returns."""

    def __init__(self, trial: Any, interval: float) -> None:
        self.trial = trial
        self.interval = interval
        self.deleted = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mltrace-watch-deleted",
                                        daemon=True)

    def __enter__(self) -> _DeletionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def _run(self) -> None:
        misses = 0
        while not self._stop.wait(self.interval):
            try:
                gone = not self.trial.storage.list(paths.COLLECTIONS_DIR)
            except Exception as exc:  # S3 down for a moment is not a deletion
                logger.debug("cannot check %s: %s", self.trial.path, exc)
                continue
            misses = misses + 1 if gone else 0
            if misses >= 2:  # twice in a row: not a listing caught mid-rewrite
                logger.warning("trial %s was deleted: its rules stop", self.trial.path)
                self.deleted = True
                # The reader's own flag for "training ended": wait_for_steps then raises
                # NoMoreData at the next step instead of waiting for steps that never come.
                self.trial.loaded_all_steps = True
                return


def _tracked(trial: Any) -> bool:
    """True when the trial's hook logged to MLflow and MLflow is installed here."""
    import importlib.util

    try:
        return (trial.storage.exists(paths.MLFLOW_RUN_FILE)
                and importlib.util.find_spec("mlflow") is not None)
    except Exception:  # the trial's storage went away: nothing to retry for MLflow's sake
        return False


def run_execution(execution: Execution) -> state.Outcome:
    """Run one rule on one trial to the end of training; never raises (see the module)."""
    from mltrace.rules.rule_invoker import create_rule, invoke_rule, load_rule_class
    from mltrace.trials import create_trial

    rule_cfg = execution.rule
    outcome = state.Outcome(trial=execution.trial, key=execution.key, rule=rule_cfg.name,
                            status=state.FAILED, started=time.time(),
                            host=f"{socket.gethostname()}:{os.getpid()}")
    result: results.RuleResult | None = None
    watch: _DeletionWatch | None = None
    try:
        trial = create_trial(execution.trial, timeout=execution.trial_wait)
        others = [create_trial(p, timeout=execution.trial_wait) for p in rule_cfg.other_trials]
    except Exception as exc:  # storage down, trial gone: the scheduler retries, a bounded number
        outcome.status = state.UNAVAILABLE
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.ended = time.time()
        return outcome
    try:
        cls = load_rule_class(rule_cfg.name, rule_cfg.source)
        rule = create_rule(cls, trial, others, dict(rule_cfg.params), rule_cfg.actions)
        with _DeletionWatch(trial, execution.deletion_check) as watch:
            try:
                result = invoke_rule(rule, rule_cfg.start_step, rule_cfg.end_step,
                                     listener_options={"mlflow": {"execution": execution.key}})
            except NoMoreData as exc:
                result = exc.rule_result  # type: ignore[attr-defined]
        outcome.status = state.DELETED if watch.deleted else state.FINISHED
    except Exception as exc:
        result = getattr(exc, "rule_result", None)
        outcome.error = f"{type(exc).__name__}: {exc}"
        if watch is not None and watch.deleted:
            outcome.status = state.DELETED
        else:
            logger.error("%s failed: %s\n%s", execution.name, outcome.error,
                         traceback.format_exc())
    if (outcome.status == state.FINISHED and result is not None
            and result.mlflow_run_id is None and _tracked(trial)):
        # The hook logged to MLflow but the rule's run could not be made (tracking server or
        # its database down): not finished, so that a retry or a restart records it there.
        outcome.status = state.UNAVAILABLE
        outcome.error = ("the rule ran, but its MLflow run could not be created (is the "
                         "tracking server or its database down? see the warning above); its "
                         "result is in the trial's mltrace_rules/")
    if result is not None:
        outcome.rule_status = result.status
        outcome.take_findings(result)
    outcome.ended = time.time()
    if outcome.status in (state.FINISHED, state.FAILED):  # never a deleted trial's folder back
        if execution.diagnose:  # before the record: a watcher killed meanwhile runs it again
            outcome.diagnosis = diagnose_trouble(trial, result)
        state.record(outcome, trial.storage)
    return outcome
