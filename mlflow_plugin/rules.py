"""Rule executions as MLflow runs (entry point group ``mltrace.rule_listeners``).

Every ``invoke_rule`` (API or CLI) creates a listener through ``create_listener(options)`` and
notifies it; it makes an MLflow run when tracking is configured: the trial has a run file (its
hook logged to MLflow), a parent run id is given (the listener option ``parent_run_id``:
``invoke_rule(..., listener_options={"mlflow": {"parent_run_id": ...}})``, which the rule CLI's
``--mlflow-parent-run-id`` or its environment variable ``MLTRACE_MLFLOW_PARENT_RUN_ID`` sets), or
a tracking URI is set (MLFLOW_TRACKING_URI / mlflow.set_tracking_uri). Without any of them it
does nothing and MLflow is not even imported.

The rule run:
- is a child of the training run (tag ``mlflow.parentRunId``, in the parent's experiment and
  tracking store) when the parent is known, else a top-level run in the active experiment,
  tagged with the trial location;
- has params ``rule`` and the rule's arguments; metric ``condition_met`` (1 or 0) at every
  evaluated step, and the counts ``evaluated_steps`` and ``fired_steps`` as one value each at
  step 0 (summary values: bars in MLflow's charts, numeric columns in its runs table; see
  SUMMARY_METRICS); tags ``mltrace.rule_status``, ``mltrace.first_step``, ``mltrace.message``;
  the result JSON as artifact ``mltrace/rule_result.json``; status FAILED if the rule errored
  (its traceback as artifact ``mltrace/traceback.txt``); given an ``execution`` key
  (``mltrace watch`` passes one) it is tagged ``mltrace.watch.execution``, and an execution that
  runs again (its watcher was killed) resumes that run, logging only steps not logged before;
  its name shows the outcome in the runs table (``✖ VanishingGradient: IssuesFound @210``,
  ``∅ DeadRelu: NothingChecked``, ``… VanishingGradient: InProgress`` while it runs), the mark first since the
  table cuts long names.

The training run's description (``mlflow.note.content``, description.py) is rewritten as each
rule starts, first fires and ends; once training has ended its ``summary.html`` is written again
with the findings. ``result.mlflow_url`` is the rule run's page in the UI's machine-learning view
(links.py) when the tracking URI is a server.

When the condition is met the training run gets the tags ``mltrace.rule.<Rule>.status``
(``IssuesFound``), ``.first_step``, ``.message``, ``.run_id`` and ``mltrace.issues_found=true``,
set at the first step where it holds (visible while training goes on) and updated at the end;
a rule that finds nothing leaves ``.status`` = ``NoIssuesFound``. Find them with e.g.
``mlflow.search_runs(filter_string=
"tags.`mltrace.rule.VanishingGradient.status` = 'IssuesFound'")``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mltrace import __version__
from mltrace.exceptions import MltraceValueError
from mltrace.rules import results

from . import _keys, _tracking, links
from .description import STATUS_MARKS

logger = logging.getLogger(__name__)

METRIC_CONDITION_MET = "condition_met"
METRIC_EVALUATED_STEPS = "evaluated_steps"
METRIC_FIRED_STEPS = "fired_steps"
#: A rule run's counts: one value each, logged at step 0 when the rule ends. Metrics, not params:
#: the runs table shows them as numeric columns (sorted as numbers, filtered with
#: ``metrics.fired_steps > 0``), and a resumed run can log them again (a param cannot change).
#: Step 0, not the last step: MLflow's chart view (3.17) draws a metric whose latest value is at
#: step 0 as a bar per run, and one at a later step as a line chart, where a single value is a
#: lone dot.
SUMMARY_METRICS = (METRIC_EVALUATED_STEPS, METRIC_FIRED_STEPS)
_FLUSH_SECONDS = 5.0


#: The listener's options (``invoke_rule(listener_options={"mlflow": {...}})``).
OPTIONS = {
    "parent_run_id": "MLflow run whose child the rule run is (default: the run in the trial's "
                     "run file, if any)",
    "execution": "a key naming this rule execution of this trial (``mltrace watch`` gives one): "
                 "a run tagged with it is resumed instead of creating another, so a restarted "
                 "watcher never duplicates rule runs or their metrics",
}


def create_listener(options: Mapping[str, Any] | None = None) -> MlflowRuleListener | None:
    """The entry point's factory: a listener for one rule execution, or None when MLflow is not
    installed.

    Args:
        options: see OPTIONS.

    Raises:
        MltraceValueError: an unknown option (the message lists the valid ones).
    """
    import importlib.util

    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise MltraceValueError(
            f"MLflow rule listener option(s) {unknown} unknown; valid: "
            + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items()))
    if importlib.util.find_spec("mlflow") is None:
        return None
    return MlflowRuleListener(parent_run_id=options.get("parent_run_id") or None,
                              execution=options.get("execution") or None)


@dataclass
class _RuleRun:
    client: Any
    run_id: str
    experiment_id: str
    parent_run_id: str | None
    metrics: list = field(default_factory=list)
    last_flush: float = field(default_factory=time.monotonic)
    tagged_first: bool = False
    #: steps whose condition_met an earlier attempt of a resumed run already logged
    logged_steps: set[int] = field(default_factory=set)


class MlflowRuleListener:
    """Turns rule executions into MLflow runs (see the module docstring).

    Args:
        parent_run_id: the MLflow run whose child each rule run is; None: the run in the trial's
            run file, if any.
        execution: a key of the rule execution (see OPTIONS); None: always a new run.
    """

    def __init__(self, parent_run_id: str | None = None, execution: str | None = None) -> None:
        self.parent_run_id = parent_run_id
        self.execution = execution
        self._runs: dict[str, _RuleRun] = {}

    # -- listener protocol ------------------------------------------------------------------
    def started(self, rule: Any, result: results.RuleResult) -> None:
        """Create the rule's MLflow run (if tracking is configured) and record its ids in
        ``result``."""
        parent_id = self.parent_run_id
        run_file = _tracking.read_run_file(rule.base_trial.storage)
        configured = _tracking.tracking_configured()
        if not (parent_id or run_file or configured):
            return
        from mlflow import MlflowClient

        if run_file is not None and (
                not parent_id or parent_id == run_file.run_id or not configured):
            uri = run_file.tracking_uri
            parent_id = parent_id or run_file.run_id
        else:
            uri = _tracking.resolve_tracking_uri()
        client = MlflowClient(tracking_uri=uri)
        parent = self._parent_run(client, parent_id, uri, rule.rule_name) if parent_id else None
        state = self._resumed_run(client, uri, rule, parent) if self.execution else None
        if state is None:
            state = self._create_run(client, uri, rule, parent, self.execution)
        self._runs[result.run_id] = state
        result.mlflow_run_id = state.run_id
        result.mlflow_experiment_id = state.experiment_id
        result.mlflow_url = links.run_url(uri, state.experiment_id, state.run_id)
        params = {"rule": rule.rule_name, **{str(k): v for k, v in result.parameters.items()}}
        if getattr(rule, "other_trials", None):
            params["other_trials"] = ",".join(t.path for t in rule.other_trials)
        if getattr(rule, "action_str", None):
            params["action_str"] = rule.action_str
        self._log_params(state, params)
        if state.parent_run_id:
            self._tag(state.client, state.parent_run_id, {
                _keys.rule_tag(rule.rule_name, "status"): results.IN_PROGRESS,
                _keys.rule_tag(rule.rule_name, "run_id"): state.run_id,
            })
            self._describe_parent(rule, state)

    @staticmethod
    def _parent_run(client: Any, parent_id: str, uri: str, rule_name: str) -> Any:
        """The parent run, or None (logged) when it is deleted or cannot be found."""
        try:
            parent = client.get_run(parent_id)
        except Exception as exc:
            logger.warning("parent MLflow run %s not found at %s (%s): %s runs as a top-level "
                           "run", parent_id, uri, exc, rule_name)
            return None
        if parent.info.lifecycle_stage == "deleted":
            logger.warning("parent MLflow run %s is deleted: %s runs as a top-level run",
                           parent_id, rule_name)
            return None
        return parent

    @staticmethod
    def _experiment_id(client: Any, uri: str, parent: Any) -> str:
        """The parent's experiment when there is a parent, else the active one."""
        import mlflow

        if parent is not None:
            return str(parent.info.experiment_id)
        fluent = uri == _tracking.absolute_uri(mlflow.get_tracking_uri())
        return str(_tracking.experiment_id_for(client, fluent_store=fluent))

    def _resumed_run(self, client: Any, uri: str, rule: Any, parent: Any) -> _RuleRun | None:
        """The run an earlier attempt of this execution created (tagged with its key and the
        trial), set RUNNING again, or None when there is none."""
        experiment_id = self._experiment_id(client, uri, parent)
        trial = _tracking.trial_location(rule.base_trial.path)
        found = client.search_runs(
            [experiment_id], max_results=1, order_by=["attributes.start_time ASC"],
            filter_string=(f"tags.`{_keys.TAG_EXECUTION}` = '{_quote(self.execution)}' AND "
                           f"tags.`{_keys.TAG_TRIAL}` = '{_quote(trial)}'"))
        if not found:
            return None
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        logged = {m.step for m in client.get_metric_history(run_id, METRIC_CONDITION_MET)}
        logger.info("%s on %s: resuming MLflow run %s (execution %s; %d steps logged before)",
                    rule.rule_name, trial, run_id, self.execution, len(logged))
        return _RuleRun(client, run_id, experiment_id,
                        parent.info.run_id if parent is not None else None, logged_steps=logged)

    @classmethod
    def _create_run(cls, client: Any, uri: str, rule: Any, parent: Any,
                    execution: str | None = None) -> _RuleRun:
        """The rule's run: in the parent's experiment when there is a parent, else in the
        active one."""
        from mlflow.tracking.context.registry import resolve_tags

        experiment_id = cls._experiment_id(client, uri, parent)
        tags = {
            _keys.TAG_RUN_TYPE: "rule", _keys.TAG_RULE: rule.rule_name,
            _keys.TAG_VERSION: __version__,
            _keys.TAG_TRIAL: _tracking.trial_location(rule.base_trial.path),
            _keys.TAG_RULE_STATUS: results.IN_PROGRESS,
        }
        if parent is not None:
            tags[_keys.PARENT_RUN_TAG] = parent.info.run_id
        if execution:
            tags[_keys.TAG_EXECUTION] = execution
        run = client.create_run(experiment_id,
                                run_name=run_name(rule.rule_name, results.IN_PROGRESS),
                                tags={k: _keys.tag_value(v) for k, v in resolve_tags(tags).items()})
        return _RuleRun(client, run.info.run_id, experiment_id,
                        parent.info.run_id if parent is not None else None)

    def step_evaluated(self, rule: Any, result: results.RuleResult, step: int, met: bool) -> None:
        """Queue the step's metric; at the first step where the condition holds, tag both runs."""
        state = self._runs.get(result.run_id)
        if state is None:
            return
        from mlflow.entities import Metric

        if int(step) in state.logged_steps:  # a resumed run: an earlier attempt logged it
            if met:
                state.tagged_first = True
            return
        state.metrics.append(Metric(METRIC_CONDITION_MET, 1.0 if met else 0.0,
                                    int(time.time() * 1000), int(step)))
        if met and not state.tagged_first:
            state.tagged_first = True
            self._flush(state)
            self._tag_findings(rule, result, state, results.ISSUES_FOUND)
            self._show_status(rule, result, state, results.ISSUES_FOUND)
        elif (len(state.metrics) >= _keys.MAX_METRICS_PER_BATCH
              or time.monotonic() - state.last_flush > _FLUSH_SECONDS):
            self._flush(state)

    def finished(self, rule: Any, result: results.RuleResult) -> None:
        """Flush, record the outcome on the rule run (and the parent) and end the rule run."""
        state = self._runs.pop(result.run_id, None)
        if state is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # Counts, not series: one value each at step 0 (see SUMMARY_METRICS).
        state.metrics += [Metric(METRIC_EVALUATED_STEPS, float(result.evaluated_steps), now, 0),
                          Metric(METRIC_FIRED_STEPS, float(len(result.fired_steps)), now, 0)]
        try:
            self._flush(state)
            self._tag_findings(rule, result, state, result.status)
            self._show_status(rule, result, state, result.status)
            from dataclasses import asdict

            state.client.log_dict(state.run_id, asdict(result),
                                  f"{_keys.ARTIFACT_DIR}/rule_result.json")
            if result.traceback:
                state.client.log_text(state.run_id, result.traceback,
                                      f"{_keys.ARTIFACT_DIR}/traceback.txt")
        finally:
            failed = result.status == results.ERROR
            links.end_run(state.client, state.run_id, "FAILED" if failed else "FINISHED")

    # -- helpers ----------------------------------------------------------------------------
    def _show_status(self, rule: Any, result: results.RuleResult, state: _RuleRun,
                     status: str) -> None:
        """Make the status visible where people look: the rule run's name in the runs table
        (``VanishingGradient: IssuesFound @210``), and the training run's description (and, once
        training has ended, its summary.html). A failure here is logged, never the rule's."""
        try:
            state.client.update_run(state.run_id, name=run_name(rule.rule_name, status,
                                                                result.first_step))
        except Exception as exc:
            logger.warning("could not rename MLflow rule run %s: %s", state.run_id, exc)
        self._describe_parent(rule, state, result)

    @staticmethod
    def _describe_parent(rule: Any, state: _RuleRun,
                         result: results.RuleResult | None = None) -> None:
        """Rewrite the training run's description from its rule tags; once the training run
        has ended (its sink wrote summary.html), write its summary again with these findings."""
        if not state.parent_run_id:
            return
        from . import description

        try:
            description.update_training_description(state.client, state.parent_run_id,
                                                     rule.base_trial)
            if state.client.get_run(state.parent_run_id).info.status != "RUNNING":
                from . import summary

                summary.log_summary(state.client, state.parent_run_id, rule.base_trial, result)
        except Exception as exc:
            logger.warning("could not update the description of MLflow run %s: %s",
                           state.parent_run_id, exc)

    def _tag_findings(self, rule: Any, result: results.RuleResult, state: _RuleRun,
                      status: str) -> None:
        own = {_keys.TAG_RULE_STATUS: status}
        if result.first_step is not None:
            own[_keys.TAG_FIRST_STEP] = str(result.first_step)
        if result.message:
            own[_keys.TAG_MESSAGE] = result.message
        if result.error:
            own["mltrace.error"] = result.error
        summary = f"**{rule.rule_name}**: {status}"
        if result.first_step is not None:
            summary += f", first at step {result.first_step}: {result.message or ''}"
        own["mlflow.note.content"] = summary
        self._tag(state.client, state.run_id, own)
        if not state.parent_run_id:
            return
        name = rule.rule_name
        parent = {_keys.rule_tag(name, "status"): status,
                  _keys.rule_tag(name, "run_id"): state.run_id}
        if result.first_step is not None:
            parent[_keys.rule_tag(name, "first_step")] = str(result.first_step)
            parent[_keys.rule_tag(name, "message")] = result.message or ""
            parent[_keys.TAG_ISSUES_FOUND] = "true"
        self._tag(state.client, state.parent_run_id, parent)

    @staticmethod
    def _tag(client: Any, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, _keys.tag_value(v)) for k, v in tags.items()]
        for chunk in _keys.chunks(items, _keys.MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, tags=chunk, synchronous=True)

    @staticmethod
    def _log_params(state: _RuleRun, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(_keys.clean_key(k), _keys.param_value(v)) for k, v in params.items()]
        for chunk in _keys.chunks(items, _keys.MAX_PARAMS_TAGS_PER_BATCH):
            state.client.log_batch(state.run_id, params=chunk, synchronous=True)

    @staticmethod
    def _flush(state: _RuleRun) -> None:
        metrics, state.metrics = state.metrics, []
        state.last_flush = time.monotonic()
        for chunk in _keys.chunks(metrics, _keys.MAX_METRICS_PER_BATCH):
            state.client.log_batch(state.run_id, metrics=chunk, synchronous=True)


def run_name(rule_name: str, status: str, first_step: int | None = None) -> str:
    """A rule run's name in MLflow's runs table: a mark of its outcome, the rule, its status and
    the global step where it first fired (``✖ VanishingGradient: IssuesFound @210``)."""
    at = f" @{first_step}" if status == results.ISSUES_FOUND and first_step is not None else ""
    mark = STATUS_MARKS.get(status)  # first: MLflow's runs table cuts names at ~16 characters
    return f"{mark + ' ' if mark else ''}{rule_name}: {status}{at}"


def _quote(value: str | None) -> str:
    """``value`` for a single-quoted MLflow filter string."""
    return (value or "").replace("\\", "\\\\").replace("'", "\\'")
