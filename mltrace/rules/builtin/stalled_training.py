"""StalledTrainingRule: no new tensor written for too long."""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

from mltrace.exceptions import RuleEvaluationConditionMet
from mltrace.rules.actions import StopTraining
from mltrace.rules.builtin._params import as_bool, as_float, as_optional_str
from mltrace.rules.rule import Rule
from mltrace.trials import StepState, Trial


def step_wall_time(trial: Trial, step: int) -> float | None:
    """When global ``step`` was written: the wall time of one of its records (None if unknown)."""
    return trial.step_wall_time(step)


class StalledTrainingRule(Rule):
    """Fires when no new tensor was written for ``threshold`` seconds.

    On a finished trial, fires at a step written more than ``threshold`` seconds after the
    previous saved step (from the records' wall times). While following a live trial, also fires
    when waiting for the next step has lasted ``threshold`` seconds since the newest record
    (or since the rule started, before any), at the step being waited for; it reports one stall
    once and then waits on as any rule does.

    Args:
        base_trial: the trial to watch.
        threshold: default 1800 seconds.
        stop_training_on_fire: default False; True adds the stoptraining action (the hook
            reads the stop signal at its next step, should training resume).
        training_job_name_prefix: accepted for SageMaker compatibility; mltrace stops the
            training that writes this trial, whatever its job name (logged when given).

    Needs wall times in the records (every mltrace and smdebug hook writes them); the precision
    is the time between saved steps, so save often enough for the threshold you choose.
    """

    def __init__(self, base_trial: Trial, threshold: Any = 1800, stop_training_on_fire: Any = False,
                 training_job_name_prefix: Any = None, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.threshold = as_float(name, "threshold", threshold, 0, inclusive=False)
        self.stop_training_on_fire = as_bool(name, "stop_training_on_fire", stop_training_on_fire)
        self.training_job_name_prefix = as_optional_str(training_job_name_prefix)
        if self.training_job_name_prefix:
            self.logger.info("training_job_name_prefix=%s: SageMaker job names do not apply; the "
                             "stop signal goes to the trial at %s", self.training_job_name_prefix,
                             base_trial.path)
        stops = any(isinstance(a, StopTraining) for a in self.actions)
        if self.stop_training_on_fire and not stops:
            self.actions.append(StopTraining())
        self._started = time.time()
        self._walls: dict[int, float | None] = {}
        self._previous: int | None = None
        self._reported_since: float | None = None

    def _wall(self, step: int) -> float | None:
        if step not in self._walls:
            self._walls[step] = step_wall_time(self.base_trial, step)
        return self._walls[step]

    def invoke(self, step: int) -> None:
        """Wait for ``step`` as Rule.invoke does, but fire if the wait shows a stall."""
        trial = self.base_trial
        while trial.has_passed_step(step) is StepState.NOT_YET_AVAILABLE:
            saved = trial.saved_steps()
            last = (self._wall(saved[-1]) if saved else None) or self._started
            idle = time.time() - last
            if idle > self.threshold and self._reported_since != last:
                self._reported_since = last
                self._fire(step, f"no tensor written for {idle:.0f} s while waiting for step "
                                 f"{step} (threshold {self.threshold:g} s)")
            if idle > self.threshold:
                break  # reported: wait on in Rule.invoke (bounded by the trial's step timeout)
            time.sleep(max(0.01, min(trial.poll_interval, self.threshold - idle)))
            trial.maybe_refresh(force=True)
        super().invoke(step)

    def _fire(self, step: int, message: str) -> None:
        self.last_message = message
        self.evaluations.append((step, True))
        self.report["Datapoints"] += 1
        self.report["RuleTriggered"] += 1
        self.report["Violations"] += 1
        for action in self.actions:
            action.invoke(self, step)
        raise RuleEvaluationConditionMet(self.rule_name, step)

    def invoke_at_step(self, step: int) -> bool:
        previous = self._previous
        if previous is None or previous >= step:
            saved = self.base_trial.saved_steps()
            pos = bisect_left(saved, step)
            previous = saved[pos - 1] if pos else None
        self._previous = step
        wall = self._wall(step)
        before = None if previous is None else self._wall(previous)
        if wall is None or before is None:
            return False
        gap = wall - before
        if gap > self.threshold:
            self.last_message = (f"no tensor written for {gap:.0f} s between step {previous} and "
                                 f"step {step} (threshold {self.threshold:g} s)")
            return True
        return False
