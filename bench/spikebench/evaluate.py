"""The rules, run after training on each saved trial (offline), as a user runs them: the class
looked up by name, built with its defaults (or the parameters given), ``invoke_rule`` over
every step of the trial.

A rule that mltrace does not have is "missing"; one that raises (a trial without the signals it
reads, a bug) is "error" with the exception's text; neither stops the benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.rules import invoke_rule
from mltrace.rules.builtin import rule_class
from mltrace.rules.rule_invoker import create_rule
from mltrace.trials import Trial, create_trial

from .train import RunRecord

#: The stability rules, in the table's order, and smdebug's LossNotDecreasing (its false alarms
#: on a healthy transformer run) with and without its noise-aware option. ``Rule[p=v,...]`` is
#: a rule with parameters of its own.
RULES = ("LossSpike", "GradNormSpike", "UpdateRatio", "AttentionLogitGrowth",
         "AttentionEntropyCollapse", "OutputLogitDrift", "MassiveActivation",
         "LinearOutputGrowth", "AdamEpsilonDominance", "AdamStaleSecondMoment", "WorkerDivergence",
         "LossNotDecreasing", "LossNotDecreasing[noise_aware=true;num_steps=20]",
         "LossNotDecreasing[noise_aware=true;num_steps=50]")
OK, MISSING, ERROR = "ok", "missing", "error"


@dataclass
class RuleOutcome:
    """One rule on one trial: its status, the steps it fired at, its first message, and the
    seconds it took."""

    rule: str
    status: str
    fired: list[int] = field(default_factory=list)
    message: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(trial_dir: str, steps: int, rules: tuple[str, ...] = RULES,
             params: Mapping[str, Mapping[str, str]] | None = None) -> list[RuleOutcome]:
    """Run each rule in ``rules`` over steps 0 to ``steps`` - 1 of the trial at ``trial_dir``,
    with its defaults but for ``params[rule]`` (parameters as strings, as on the CLI)."""
    trial = create_trial(trial_dir)
    return [_evaluate_one(trial, name, steps, dict((params or {}).get(name, {})))
            for name in rules]


def evaluate_run(record: RunRecord, rules: tuple[str, ...] = RULES,
                 params: Mapping[str, Mapping[str, str]] | None = None) -> list[RuleOutcome]:
    """``evaluate`` over a run's trial and steps."""
    return evaluate(record.trial_dir, record.steps, rules, params)


def _evaluate_one(trial: Trial, name: str, steps: int, params: dict[str, str]) -> RuleOutcome:
    base, _, spec = name.partition("[")  # a variant: Rule[param=value,...]
    params = {**dict(item.split("=", 1) for item in spec.rstrip("]").split(";") if item), **params}
    try:
        cls = rule_class(base)
    except MltraceValueError:
        return RuleOutcome(name, MISSING)
    start = time.perf_counter()
    try:
        rule = create_rule(cls, trial, [], params)
        result = invoke_rule(rule, start_step=0, end_step=steps, raise_eval_cond=False)
    except Exception as exc:  # the benchmark reports a failing rule and goes on
        return RuleOutcome(name, ERROR, message=f"{type(exc).__name__}: {exc}",
                           seconds=time.perf_counter() - start)
    return RuleOutcome(name, OK, list(result.fired_steps), result.message,
                       time.perf_counter() - start)
