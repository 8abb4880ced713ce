"""The record of one rule execution: status, steps evaluated, steps where it fired, message.

Each execution writes a small JSON into the trial (``mltrace_rules/``), which the TensorBoard
plugin shows without MLflow, and notifies listeners: the MLflow side registers a listener
factory (entry point group ``mltrace.rule_listeners``, see mltrace.plugins) whose listener turns
the execution into an MLflow run. ``invoke_rule`` creates the listeners of each execution with
their options (``listener_options``), so no state passes between modules otherwise.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mltrace import plugins
from mltrace.exceptions import MltraceValueError
from mltrace.format import paths

if TYPE_CHECKING:
    from mltrace.rules.rule import Rule

logger = logging.getLogger(__name__)

NO_ISSUES_FOUND = "NoIssuesFound"
ISSUES_FOUND = "IssuesFound"
IN_PROGRESS = "InProgress"
ERROR = "Error"
#: The rule ran but found no tensor to check (e.g. DeadRelu on a trial without ReLU outputs):
#: not the same as checking and finding nothing.
NOTHING_CHECKED = "NothingChecked"


@dataclass(kw_only=True)
class RuleFindings:
    """What a rule execution found: the rule's result keeps it, and so does ``mltrace watch``'s
    record of the execution (mltrace.watch.state.Outcome), which copies it with ``take_findings``.
    Keyword-only, so that a record's own fields keep their positions."""

    evaluated_steps: int = 0
    fired_steps: list[int] = field(default_factory=list)
    first_step: int | None = None
    message: str | None = None
    mlflow_run_id: str | None = None

    def take_findings(self, other: RuleFindings) -> None:
        """Copy ``other``'s findings into this record (its fired steps as a list of its own)."""
        self.evaluated_steps = other.evaluated_steps
        self.fired_steps = list(other.fired_steps)
        self.first_step = other.first_step
        self.message = other.message
        self.mlflow_run_id = other.mlflow_run_id


@dataclass
class RuleResult(RuleFindings):
    """What one execution of a rule found (also the JSON written into the trial)."""

    rule: str
    trial: str
    parameters: dict[str, Any]
    status: str = IN_PROGRESS
    started: float = field(default_factory=time.time)
    ended: float | None = None
    error: str | None = None
    #: the Python traceback of an error (None unless ``error``), for the MLflow run's artifact
    traceback: str | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    mlflow_experiment_id: str | None = None
    #: the rule run's page in the MLflow UI (set by the MLflow listener when the tracking store
    #: is a server, whose address is the UI's), in the UI's machine-learning view
    mlflow_url: str | None = None

    def to_json(self) -> str:
        """The result as JSON text."""
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def key(self) -> str:
        """Where the result lives inside the trial."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.started))
        return f"{paths.RULE_RESULTS_DIR}/{self.rule}_{stamp}_{self.run_id}.json"


class RuleListener(Protocol):
    """Receives a rule execution's progress (the MLflow side implements it)."""

    def started(self, rule: Rule, result: RuleResult) -> None: ...
    def step_evaluated(self, rule: Rule, result: RuleResult, step: int, met: bool) -> None: ...
    def finished(self, rule: Rule, result: RuleResult) -> None: ...


#: Listeners added with add_rule_listener: notified of every rule execution in this process.
_listeners: list[RuleListener] = []


def add_rule_listener(listener: RuleListener) -> None:
    """Notify ``listener`` of every rule execution in this process."""
    _listeners.append(listener)


def remove_rule_listener(listener: RuleListener) -> None:
    """Stop notifying ``listener``."""
    if listener in _listeners:
        _listeners.remove(listener)


def rule_listeners(options: Mapping[str, Mapping[str, Any]] | None = None) -> list[RuleListener]:
    """The listeners of one rule execution: those added with ``add_rule_listener``, then one
    made by each factory of the ``mltrace.rule_listeners`` registry (mltrace.plugins; entry
    points of other packages), given its options. A factory that fails is logged and skipped.

    Args:
        options: options per listener name, e.g. ``{"mlflow": {"parent_run_id": "..."}}``.

    Raises:
        MltraceValueError: a listener refuses its options.
    """
    options = dict(options or {})
    factories = plugins.rule_listeners.items()
    for name in sorted(set(options) - set(factories)):
        logger.warning("options for rule listener %r are ignored: %s", name,
                       plugins.rule_listeners.describe_missing(name))
    found = list(_listeners)
    for name, factory in factories.items():
        try:
            listener = _create_listener(factory, dict(options.get(name) or {}))
        except MltraceValueError:
            raise
        except Exception as exc:  # a broken plugin must not stop the rule
            logger.warning("rule listener plugin %s could not be created: %s: %s", name,
                           type(exc).__name__, exc)
            continue
        if listener is not None:
            found.append(listener)
    return found


def _create_listener(factory: Callable[..., Any], options: dict[str, Any]) -> Any:
    """``factory(options)``; a factory that takes no argument (written before listeners had
    options) is called without, when there are no options to give it."""
    try:
        takes_options = bool(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # no signature to read (a builtin): assume the protocol
        takes_options = True
    if not takes_options and not options:
        return factory()
    return factory(options)


def notify(event: str, *args: Any, listeners: Sequence[RuleListener] | None = None) -> None:
    """Call ``event`` on each of ``listeners`` (default: ``rule_listeners()``); a failing
    listener is logged, never fatal to the rule."""
    for listener in rule_listeners() if listeners is None else listeners:
        try:
            getattr(listener, event)(*args)
        except Exception as exc:
            logger.warning("rule listener %s failed in %s: %s", type(listener).__name__, event, exc)


def save_result(rule: Rule, result: RuleResult) -> None:
    """Write ``result`` into the rule's base trial (a warning if the trial is read-only)."""
    try:
        rule.base_trial.storage.write(result.key, result.to_json().encode())
    except Exception as exc:
        logger.warning("could not write the rule result into %s: %s", rule.base_trial.path, exc)


_NUMBER = (int, float)
#: The JSON type each field of a stored result must have (None allowed where the default is None).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "rule": (str,), "trial": (str,), "parameters": (dict,), "status": (str,), "started": _NUMBER,
    "ended": _NUMBER, "evaluated_steps": (int,), "fired_steps": (list,), "first_step": (int,),
    "message": (str,), "error": (str,), "traceback": (str,), "run_id": (str,), "mlflow_run_id": (str,),
    "mlflow_experiment_id": (str,), "mlflow_url": (str,),
}
_OPTIONAL = {"ended", "first_step", "message", "error", "traceback", "mlflow_run_id", "mlflow_experiment_id",
             "mlflow_url"}


def _checked(result: RuleResult) -> RuleResult:
    """``result`` if every field has its type (valid JSON can still be a damaged result, and the
    TensorBoard panel sorts and shows these fields), else TypeError naming the field."""
    for name, types in _FIELD_TYPES.items():
        value = getattr(result, name)
        if value is None and name in _OPTIONAL:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise TypeError(f"{name}={value!r} is not a {' or '.join(t.__name__ for t in types)}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in result.fired_steps):
        raise TypeError(f"fired_steps={result.fired_steps!r} is not a list of steps")
    return result


def read_results(storage: Any) -> list[RuleResult]:
    """Every rule result stored in a trial, oldest first (damaged files are skipped with a
    warning naming them)."""
    out = []
    for key in storage.list(paths.RULE_RESULTS_DIR):
        try:
            out.append(_checked(RuleResult(**json.loads(storage.read(key)))))
        except (ValueError, TypeError, RecursionError) as exc:
            logger.warning("skipping damaged rule result %s/%s: %s: %s",
                           getattr(storage, "uri", ""), key, type(exc).__name__, exc)
    return sorted(out, key=lambda r: r.started)
