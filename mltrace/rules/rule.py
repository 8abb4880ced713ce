"""Rule: a condition over a trial, checked step by step (smdebug's programming model).

Subclass it, implement ``invoke_at_step(step) -> bool`` (and optionally
``set_required_tensors(step)``), then run it with ``invoke_rule``. Constructor arguments other
than the trials should accept strings: the CLI and rule specifications pass every value as one.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

# no_refresh lives at smdebug's place now; importing it from here keeps working
from mltrace.analysis.utils import no_refresh as no_refresh
from mltrace.exceptions import MltraceValueError, RuleEvaluationConditionMet
from mltrace.modes import ModeKeys
from mltrace.rules.req_tensors import RequiredTensors
from mltrace.trials import Trial


class Rule(ABC):
    """Base class of every rule.

    Args:
        base_trial: the trial the rule watches.
        other_trials: other trials to compare with (a Trial or a list of Trials).
        action_str: actions to run when the condition is met (JSON, see mltrace.rules.actions).

    smdebug 1.0.34 declared ``Rule(base_trial, action_str, other_trials=None)``, so a second
    positional argument that is a string is taken as the action string.
    """

    def __init__(self, base_trial: Trial, other_trials: Any = None, action_str: Any = None) -> None:
        if isinstance(other_trials, str):
            other_trials, action_str = action_str, other_trials
        if other_trials is None:
            others: list[Trial] = []
        elif isinstance(other_trials, Trial):
            others = [other_trials]
        else:
            others = list(other_trials)
        if not isinstance(base_trial, Trial) or not all(isinstance(t, Trial) for t in others):
            raise MltraceValueError(
                f"{type(self).__name__}: base_trial and other_trials must be trials from "
                "mltrace.trials.create_trial(path)"
            )
        self.base_trial = base_trial
        self.other_trials = others
        self.trials = [base_trial, *others]
        self.rule_name = type(self).__name__
        self.logger = logging.getLogger(f"mltrace.rules.{self.rule_name}")
        self.req_tensors = RequiredTensors(base_trial, others)
        from mltrace.rules.actions import parse_actions

        self.actions = parse_actions(action_str, self.rule_name)
        self.action_str = action_str
        #: (step, condition met) for each step evaluated, in order.
        self.evaluations: list[tuple[int, bool]] = []
        #: Tensors the rule reported checking (note_checked); None while it reported nothing.
        self.checked_tensors: set[str] | None = None
        #: Extra details a rule wants reported (message, offending tensors...).
        self.last_message: str | None = None
        self.report: dict[str, Any] = {"RuleTriggered": 0, "Violations": 0, "Details": {},
                                       "Datapoints": 0, "RuleParameters": ""}

    def set_required_tensors(self, step: int) -> None:  # noqa: B027 - optional, as in smdebug
        """Declare with ``self.req_tensors.add(...)`` what ``invoke_at_step(step)`` reads
        (optional: a rule that reads tensors itself leaves it out)."""

    @abstractmethod
    def invoke_at_step(self, step: int) -> bool:
        """Return True when the condition holds at global step ``step``."""

    def invoke(self, step: int) -> None:
        """Evaluate at ``step``: wait for it, fetch required tensors, run invoke_at_step.

        Raises:
            RuleEvaluationConditionMet: the condition holds (after running the actions).
            StepUnavailable, NoMoreData, TensorUnavailableForStep: as the trial raises them.
        """
        self.base_trial.wait_for_steps([step])
        with no_refresh(self.trials):
            self.req_tensors.clear()
            self.set_required_tensors(step)
            self.req_tensors.fetch()
            met = bool(self.invoke_at_step(step))
        self.evaluations.append((step, met))
        self.report["Datapoints"] += 1
        if met:
            self.report["RuleTriggered"] += 1
            self.report["Violations"] += 1
            for action in self.actions:
                action.invoke(self, step)
            raise RuleEvaluationConditionMet(self.rule_name, step)

    def note_checked(self, names: Iterable[str]) -> None:
        """Report the tensors ``invoke_at_step`` checks at this step (call it with an empty list
        too). A rule that reported, over a whole execution, only empty lists ends with status
        NothingChecked instead of NoIssuesFound; a rule that never calls it is not judged."""
        if self.checked_tensors is None:
            self.checked_tensors = set()
        self.checked_tensors.update(names)

    @property
    def nothing_checked(self) -> bool:
        """True when the rule reported its tensors and there were none."""
        return self.checked_tensors is not None and not self.checked_tensors

    def step_label(self, step: int, mode: ModeKeys | None = None) -> str:
        """How a rule message names a step: ``step 210 (EVAL step 10)``. The number after "step"
        is always the global step (every step of every mode: the x axis of the TensorBoard tab
        and of MLflow's metrics, and RuleResult.first_step); the mode's own step is beside it
        when the step belongs to a mode other than GLOBAL.

        Args:
            step: a global step, or with ``mode`` a step of that mode.
            mode: the mode ``step`` counts in (None: ``step`` is global).
        """
        if mode is None or mode is ModeKeys.GLOBAL:
            global_step: int | None = step
            mode, mode_step = self.base_trial.mode_modestep(step)
        else:
            global_step, mode_step = self.base_trial.global_step(mode, step), step
        if global_step is None:  # a mode step the trial cannot place: say which it is
            return f"{mode.name} step {mode_step}" if mode is not None else f"step {step}"
        if mode is None or mode is ModeKeys.GLOBAL or mode_step is None:
            return f"step {global_step}"
        return f"step {global_step} ({mode.name} step {mode_step})"

    @property
    def fired_steps(self) -> list[int]:
        """Steps where the condition held."""
        return [s for s, met in self.evaluations if met]

    def parameters(self) -> dict[str, Any]:
        """The rule's configuration as reported in results (public attributes that are plain
        values)."""
        skip = {"base_trial", "other_trials", "trials", "rule_name", "logger", "req_tensors",
                "actions", "evaluations", "last_message", "report", "action_str",
                "checked_tensors"}
        out = {}
        for key, value in vars(self).items():
            if key.startswith("_") or key in skip:
                continue
            if isinstance(value, (str, int, float, bool, type(None))) or (
                isinstance(value, (list, tuple))
                and all(isinstance(v, (str, int, float, bool)) for v in value)
            ):
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def __repr__(self) -> str:
        params = json.dumps(self.parameters())
        return f"<Rule {self.rule_name} on {self.base_trial.name!r} {params}>"
