"""RULES.json for ``mltrace watch``: the rule CLI's ``rules_specification`` list, plus which trials
each rule applies to.

Each entry is SageMaker's rule shape (``RuleName``, ``SourceS3Uri``, ``RuntimeConfigurations`` or
``RuleParameters`` with ``start-step``, ``end-step``, ``other-trials-paths``, ``logging-level``
and the rule's own parameters) with one more key, ``Trials`` (default: every trial):

    [{"RuleName": "VanishingGradient", "RuleParameters": {"threshold": "1e-7"},
      "Trials": "team-a/*"},
     {"RuleName": "LossNotDecreasing", "Trials": {"MlflowTags": {"team": "vision"}}}]

``Trials`` is a glob over the trial's path below the watched location (``fnmatch``: ``*``
crosses ``/``), or an object with ``PathGlob`` and/or ``MlflowTags`` (tags of the trial's
MLflow training run, all of which must match). ``Actions`` (optional) is what the rule CLI's
``--action-str`` takes, as JSON or a string: ``{"name": "stoptraining"}``,
``{"name": "dumpflightrecorder"}``, ``{"name": "notify", "webhook": "https://..."}`` or a list. Everything is checked when the file is loaded:
an unknown rule, parameter or key is an error that names it and what is valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.rules.actions import parse_actions
from mltrace.rules.rule_invoker import (
    SAGEMAKER_ONLY_KEYS,
    SPEC_KEYS,
    check_parameters,
    load_rule_class,
)

logger = logging.getLogger(__name__)

TRIALS_KEY = "Trials"
ACTIONS_KEY = "Actions"
SELECTOR_KEYS = {"PathGlob", "MlflowTags"}


@dataclass(frozen=True)
class TrialSelector:
    """Which trials a rule applies to: a path glob and/or MLflow tags (both must hold)."""

    path_glob: str | None = None
    mlflow_tags: tuple[tuple[str, str], ...] = ()

    @property
    def everything(self) -> bool:
        """True when the selector accepts every trial."""
        return self.path_glob in (None, "*", "**") and not self.mlflow_tags


@dataclass(frozen=True)
class WatchRule:
    """One configured rule: what to build, with which parameters, on which trials.

    Picklable and hashable: it travels to pool workers and Ray tasks.
    """

    name: str
    source: str | None = None
    params: tuple[tuple[str, str], ...] = ()
    start_step: int | None = None
    end_step: int | None = None
    other_trials: tuple[str, ...] = ()
    selector: TrialSelector = field(default_factory=TrialSelector)
    #: the rule's action string (JSON), None for none
    actions: str | None = None

    @property
    def key(self) -> str:
        """A stable name of this configuration (rule name + a hash of everything it runs
        with): a rule execution of a trial is (trial, key), so a changed parameter is a new
        execution and an unchanged one is never run twice."""
        parts: list[Any] = [self.name, self.source, sorted(self.params), self.start_step,
                            self.end_step, list(self.other_trials)]
        if self.actions is not None:  # keeps the keys of entries without actions unchanged
            parts.append(self.actions)
        config = json.dumps(parts)
        return f"{self.name}-{hashlib.sha1(config.encode()).hexdigest()[:10]}"


def load_watch_rules(path: str) -> list[WatchRule]:
    """Read and check RULES.json (see the module docstring).

    Raises:
        MltraceValueError: the file is missing or not JSON, or an entry names an unknown rule,
            parameter or key, or misses a required parameter (the message names the entry).
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise MltraceValueError(f"--rules {path!r}: cannot read it ({exc})") from None
    try:
        specs = json.loads(text)
    except ValueError as exc:
        raise MltraceValueError(f"--rules {path!r} is not JSON: {exc}") from None
    return parse_watch_rules(specs, where=path)


def parse_watch_rules(specs: Any, where: str = "rules") -> list[WatchRule]:
    """The WatchRules of an already-parsed RULES.json (a list of entries, or one entry).

    Raises:
        MltraceValueError: as load_watch_rules.
    """
    if isinstance(specs, dict):
        specs = [specs]
    if not isinstance(specs, list) or not specs:
        raise MltraceValueError(
            f"{where}: expected a non-empty JSON list of rules like "
            '[{"RuleName": "VanishingGradient", "Trials": "*"}]')
    rules = [_parse_entry(spec, f"{where}[{i}]") for i, spec in enumerate(specs)]
    keys = [r.key for r in rules]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise MltraceValueError(f"{where}: the same rule configuration twice: {duplicates}")
    return rules


def _parse_entry(spec: Any, where: str) -> WatchRule:
    if not isinstance(spec, dict) or not isinstance(spec.get("RuleName"), str):
        raise MltraceValueError(f"{where} needs a RuleName (a string), got {spec!r}")
    name = spec["RuleName"]
    own_keys = {TRIALS_KEY, ACTIONS_KEY}
    unknown = sorted(set(spec) - SPEC_KEYS - SAGEMAKER_ONLY_KEYS - own_keys)
    if unknown:
        raise MltraceValueError(f"{where} ({name}): unknown keys {unknown}; known: "
                                f"{sorted(SPEC_KEYS | own_keys)}")
    ignored = sorted(set(spec) & SAGEMAKER_ONLY_KEYS)
    if ignored:
        logger.warning("%s (%s): %s only mean something on SageMaker; ignored", where, name,
                       ", ".join(ignored))
    given = spec.get("RuntimeConfigurations") or spec.get("RuleParameters") or {}
    if not isinstance(given, dict):
        raise MltraceValueError(f"{where} ({name}): RuntimeConfigurations must be an object")
    config = {str(k): str(v) for k, v in given.items()}
    config.pop("logging-level", None)  # the watcher's own --log-level rules its log
    try:
        start = int(config.pop("start-step")) if "start-step" in config else None
        end = int(config.pop("end-step")) if "end-step" in config else None
    except ValueError as exc:
        raise MltraceValueError(f"{where} ({name}): start-step/end-step: {exc}") from None
    others = tuple(p for p in config.pop("other-trials-paths", "").split(";") if p)
    params = {k.replace("-", "_"): v for k, v in config.items()}
    source = spec.get("SourceS3Uri") or None
    try:
        cls = load_rule_class(name, source)
    except MltraceValueError as exc:  # an unknown rule: the message lists the known ones
        text = str(exc).replace("pass --rule-file FILE", 'give "SourceS3Uri": FILE')
        raise MltraceValueError(f"{where}: {text}") from None
    check_parameters(cls, params, f"{where}: rule {name}", ("other_trial",) if others else ())
    return WatchRule(name=cls.__name__ if source is None else name, source=source,
                     params=tuple(sorted(params.items())), start_step=start, end_step=end,
                     other_trials=others, selector=_selector(spec.get(TRIALS_KEY), where, name),
                     actions=_actions(spec.get(ACTIONS_KEY), where, name))


def _actions(value: Any, where: str, name: str) -> str | None:
    """The entry's ``Actions`` as an action string, checked now (an unknown action fails at load,
    not when the rule fires)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    parse_actions(text, f"{where} ({name})")
    return text


def _selector(value: Any, where: str, name: str) -> TrialSelector:
    if value is None:
        return TrialSelector()
    if isinstance(value, str):
        return TrialSelector(path_glob=value)
    if not isinstance(value, dict) or not value or set(value) - SELECTOR_KEYS:
        raise MltraceValueError(
            f"{where} ({name}): Trials={value!r} must be a glob over trial paths (\"team-a/*\") "
            f"or an object with keys {sorted(SELECTOR_KEYS)}")
    glob = value.get("PathGlob")
    tags = value.get("MlflowTags") or {}
    if (glob is not None and not isinstance(glob, str)) or not isinstance(tags, dict):
        raise MltraceValueError(
            f"{where} ({name}): PathGlob must be a string and MlflowTags an object "
            f"{{tag: value}}, got {value!r}")
    return TrialSelector(path_glob=glob,
                         mlflow_tags=tuple(sorted((str(k), str(v)) for k, v in tags.items())))
