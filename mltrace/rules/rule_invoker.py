"""Run a rule over a trial: ``invoke_rule`` (the API) and ``python -m mltrace.rules.rule_invoker``.

CLI::

    python -m mltrace.rules.rule_invoker --trial-dir DIR --rule-name VanishingGradient \\
        [--other-trials a,b] [--start-step N] [--end-step N] [--raise-rule-eval-cond-exception] \\
        [--rule-file my_rule.py] [--<param> value ...]
    python -m mltrace.rules.rule_invoker --trial-dir DIR --rules-spec rules.json

Exit code: 0 no issue found, 1 the condition was met, 2 bad usage or an error.
"""

from __future__ import annotations

import argparse
import bisect
import importlib.util
import inspect
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mltrace.exceptions import (
    MltraceValueError,
    NoMoreData,
    RuleEvaluationConditionMet,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from mltrace.rules import results
from mltrace.rules.rule import Rule

logger = logging.getLogger(__name__)


def _next_step(rule: Rule, step: int) -> int:
    """The next global step worth evaluating: the next saved one when the trial knows it."""
    steps = rule.base_trial.saved_steps()
    pos = bisect.bisect_right(steps, step)
    return steps[pos] if pos < len(steps) else step + 1


def invoke_rule(rule: Rule, start_step: int | None = None, end_step: int | None = None,
                raise_eval_cond: bool = False, *, progress: bool = False,
                listener_options: Mapping[str, Mapping[str, Any]] | None = None,
                ) -> results.RuleResult:
    """Evaluate ``rule`` at each saved step from ``start_step`` to ``end_step`` (exclusive).

    With no ``end_step`` it follows a live trial until training ends, then raises NoMoreData
    (smdebug's contract; notebooks catch it). Steps that were not saved are skipped. Each
    execution is recorded (a JSON in the trial, and an MLflow run when tracking is configured).

    Args:
        rule: the rule object.
        start_step: first global step (default 0).
        end_step: stop before this global step (default: follow the trial to its end).
        raise_eval_cond: re-raise RuleEvaluationConditionMet at the first step where it holds.
        progress: show a progress bar over steps (tqdm).
        listener_options: options per rule listener (mltrace.rules.results.rule_listeners),
            e.g. ``{"mlflow": {"parent_run_id": run_id}}`` to make the MLflow rule run a child
            of that run.

    Returns:
        the RuleResult (also when NoMoreData or an error ends the run: it is attached to the
        exception as ``exc.rule_result``; an error's traceback is in ``result.traceback``).
    """
    step = 0 if start_step is None else int(start_step)
    result = results.RuleResult(rule=rule.rule_name, trial=rule.base_trial.path,
                                parameters=rule.parameters())
    listeners = results.rule_listeners(listener_options)
    results.notify("started", rule, result, listeners=listeners)
    bar = _progress_bar(rule, step, end_step) if progress else None
    try:
        _evaluate(rule, result, step, end_step, raise_eval_cond, bar, listeners)
    except NoMoreData as exc:
        exc.rule_result = result  # type: ignore[attr-defined]
        raise
    except RuleEvaluationConditionMet:
        raise
    except BaseException as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        result.traceback = traceback.format_exc()
        exc.rule_result = result  # type: ignore[attr-defined]
        raise
    finally:
        if bar is not None:
            bar.close()
        result.status = (results.ERROR if result.error else
                         results.ISSUES_FOUND if result.fired_steps else
                         results.NOTHING_CHECKED if rule.nothing_checked else
                         results.NO_ISSUES_FOUND)
        result.ended = time.time()
        results.notify("finished", rule, result, listeners=listeners)
        results.save_result(rule, result)
    return result


def _evaluate(rule: Rule, result: results.RuleResult, step: int, end_step: int | None,
              raise_eval_cond: bool, bar: Any, listeners: list[results.RuleListener]) -> None:
    """invoke_rule's loop: evaluate each saved step from ``step`` on, recording into ``result``."""
    while end_step is None or step < end_step:
        try:
            rule.invoke(step)
        except (TensorUnavailableForStep, StepUnavailable, TensorUnavailable) as exc:
            logger.debug("%s: step %d skipped: %s", rule.rule_name, step, exc)
        except RuleEvaluationConditionMet as exc:
            _record(rule, result, step, True, listeners)
            logger.info("%s: condition met at step %d%s", rule.rule_name, step,
                        f": {rule.last_message}" if rule.last_message else "")
            if raise_eval_cond:
                raise
            if exc.end_of_rule:
                break
        else:
            if rule.evaluations and rule.evaluations[-1][0] == step:
                _record(rule, result, step, False, listeners)
        nxt = _next_step(rule, step)
        if bar is not None:
            bar.update(nxt - step)
        step = nxt


def _record(rule: Rule, result: results.RuleResult, step: int, met: bool,
            listeners: list[results.RuleListener]) -> None:
    result.evaluated_steps += 1
    if met:
        result.fired_steps.append(step)
        if result.first_step is None:
            result.first_step = step
            result.message = rule.last_message or f"condition met at step {step}"
    results.notify("step_evaluated", rule, result, step, met, listeners=listeners)


def _progress_bar(rule: Rule, start: int, end: int | None) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    total = end
    steps = rule.base_trial.saved_steps()
    if total is None and rule.base_trial.loaded_all_steps and steps:
        total = steps[-1] + 1
    return tqdm(total=None if total is None else max(0, total - start), desc=rule.rule_name,
                unit="step", file=sys.stderr, leave=False)


# ---------------------------------------------------------------------------------------------
# Building rules from names, files and parameters given as strings
# ---------------------------------------------------------------------------------------------
def load_rule_class(rule_name: str, rule_file: str | None = None) -> type[Rule]:
    """A built-in rule by name, or class ``rule_name`` from a Python file (local or a URI that
    an installed storage backend reads, e.g. s3://bucket/rules/my_rule.py)."""
    if rule_file is None:
        from mltrace.rules.builtin import rule_class

        return rule_class(rule_name)
    path = rule_file
    if "://" in rule_file:
        from mltrace.storage import open_storage

        folder, _, name = rule_file.rpartition("/")
        data = open_storage(folder).read(name)
        fd, path = tempfile.mkstemp(suffix=".py", prefix="mltrace_rule_")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    if not os.path.isfile(path):
        raise MltraceValueError(f"rule file {rule_file!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"mltrace_user_rule_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    cls = getattr(module, rule_name, None)
    if not (inspect.isclass(cls) and issubclass(cls, Rule)):
        found = [n for n, v in vars(module).items()
                 if inspect.isclass(v) and issubclass(v, Rule) and v is not Rule]
        raise MltraceValueError(
            f"{rule_file} has no Rule subclass {rule_name!r}; it defines {found}")
    return cls


def rule_parameters(cls: type[Rule]) -> dict[str, inspect.Parameter]:
    """Constructor parameters a user sets (everything but the trials)."""
    params = dict(inspect.signature(cls.__init__).parameters)
    for skip in ("self", "base_trial", "other_trials", "action_str"):
        params.pop(skip, None)
    return {n: p for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def check_parameters(cls: type[Rule], params: Iterable[str], label: str,
                     supplied: Iterable[str] = ()) -> dict[str, inspect.Parameter]:
    """The parameters of rule ``cls`` (as rule_parameters), after checking that ``params``
    names only those and every required one but ``supplied`` (given another way).

    Raises:
        MltraceValueError: ``"<label> has no parameter ..."`` listing the valid ones, or
            ``"<label> needs parameter(s) ..."``.
    """
    valid = rule_parameters(cls)
    given = set(params)
    unknown = sorted(given - set(valid))
    if unknown:
        raise MltraceValueError(
            f"{label} has no parameter {', '.join(unknown)}; its parameters are: "
            + (", ".join(f"{n} (default {p.default!r})" if p.default is not p.empty
                         else f"{n} (required)" for n, p in valid.items()) or "none")
        )
    missing = [n for n, p in valid.items()
               if p.default is p.empty and n not in given and n not in supplied]
    if missing:
        raise MltraceValueError(f"{label} needs parameter(s) {', '.join(missing)}")
    return valid


def create_rule(cls: type[Rule], base_trial: Any, other_trials: list[Any], params: dict[str, str],
                action_str: str | None = None) -> Rule:
    """Instantiate ``cls`` with string parameters, checking names against its constructor.

    Raises:
        MltraceValueError: an unknown or missing parameter, listing the valid ones.
    """
    valid = check_parameters(cls, params, f"rule {cls.__name__}")
    signature = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = dict(params)
    if "other_trials" in signature:
        kwargs["other_trials"] = other_trials or None
    elif "other_trial" in valid and other_trials and "other_trial" not in params:
        kwargs["other_trial"] = other_trials[0]
    elif other_trials:
        raise MltraceValueError(f"rule {cls.__name__} takes no other trials")
    if action_str and "action_str" in signature:
        kwargs["action_str"] = action_str
    rule = cls(base_trial, **kwargs)
    if action_str and "action_str" not in signature:
        # a custom rule whose constructor does not pass actions on (the documented
        # ``super().__init__(base_trial, other_trials=None)``) still gets the CLI's actions
        from mltrace.rules.actions import parse_actions

        rule.actions = parse_actions(action_str, rule.rule_name)
        rule.action_str = action_str
    return rule


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
SPEC_KEYS = {"RuleName", "SourceS3Uri", "RuntimeConfigurations", "RuleParameters"}
SAGEMAKER_ONLY_KEYS = {"InstanceType", "VolumeSizeInGB", "RuleConfigurationName",
                       "RuleEvaluatorImage", "LocalPath", "S3OutputPath"}
RUNTIME_KEYS = {"start-step", "end-step", "other-trials-paths", "logging-level"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mltrace.rules.rule_invoker",
        description="Run a rule over a trial. Unknown --options become rule parameters (strings).",
    )
    p.add_argument("--trial-dir", required=True, help="the hook's out_dir (local path or URI)")
    p.add_argument("--rule-name", help="a built-in rule, or the class in --rule-file")
    p.add_argument("--rule-file", help="Python file defining the rule class (local or s3://)")
    p.add_argument("--rules-spec", help="JSON list shaped like SageMaker's rules_specification")
    p.add_argument("--other-trials", default="", help="comma-separated trial paths")
    p.add_argument("--start-step", type=int, default=None)
    p.add_argument("--end-step", type=int, default=None)
    p.add_argument("--raise-rule-eval-cond-exception", nargs="?", const="true", default="false",
                   help="stop at the first step where the condition holds, raising")
    p.add_argument("--action-str", default=None,
                   help='what to do when the condition is met (JSON, one object or a list): '
                        '{"name": "stoptraining"}, {"name": "dumpflightrecorder"} or '
                        '{"name": "notify", "webhook": "https://..."}')
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help="seconds to wait for the trial's first files (live training; default: "
                        "a path that does not exist fails at once, an existing folder waits "
                        "MLTRACE_TRIAL_WAIT seconds)")
    p.add_argument("--logging-level", default=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--mlflow-parent-run-id", default=None,
                   help="MLflow run whose child the rule run is (default: env "
                        "MLTRACE_MLFLOW_PARENT_RUN_ID, else the trial's run file)")
    return p


def _extra_params(extra: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    i = 0
    while i < len(extra):
        token = extra[i]
        if not token.startswith("--"):
            raise MltraceValueError(
                f"unexpected argument {token!r}: rule parameters are --name value")
        name, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise MltraceValueError(f"rule parameter --{name} needs a value")
            value = extra[i + 1]
            i += 1
        params[name.replace("-", "_")] = value
        i += 1
    return params


@dataclass
class _Run:
    """What running one rule from the command line needs besides the rule and its parameters."""

    trial_dir: str
    other: list[str] = field(default_factory=list)
    start: int | None = None
    end: int | None = None
    raise_cond: bool = False
    action_str: str | None = None
    wait: float | None = None
    progress: bool = False
    listener_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def _run_one(run: _Run, rule_name: str, rule_file: str | None, params: dict[str, str]) -> int:
    from mltrace.trials import create_trial

    cls = load_rule_class(rule_name, rule_file)
    for path in (run.trial_dir, *run.other):
        if run.wait is None and "://" not in path and not os.path.exists(path):
            raise MltraceValueError(
                f"trial {path!r} does not exist: pass a hook's out_dir, or --wait SECONDS to "
                "wait for a training job that has not written its first step yet")
    base = create_trial(run.trial_dir, timeout=run.wait)  # None: the default wait
    others = [create_trial(p, timeout=run.wait) for p in run.other]
    rule = create_rule(cls, base, others, params, run.action_str)
    try:
        result = invoke_rule(rule, run.start, run.end, run.raise_cond, progress=run.progress,
                             listener_options=run.listener_options)
    except NoMoreData as exc:
        result = exc.rule_result  # type: ignore[attr-defined]
    found = bool(result.fired_steps)
    summary = f"{rule.rule_name}: {result.status}; evaluated {result.evaluated_steps} steps"
    if found:
        summary += f"; fired at steps {_short(result.fired_steps)}: {result.message}"
    elif result.status == results.NOTHING_CHECKED:
        summary += "; no tensor of the trial matched what the rule inspects (see its parameters)"
    print(summary)
    if result.mlflow_run_id and not result.mlflow_url:  # a server's link was printed at its end
        print(f"  MLflow run {result.mlflow_run_id} (experiment {result.mlflow_experiment_id}); "
              "open it in `mlflow ui` on that tracking store")
    return 1 if found else 0


def _short(steps: list[int]) -> str:
    more = f" ... ({len(steps)} in all)" if len(steps) > 10 else ""
    return ", ".join(map(str, steps[:10])) + more


def _run_spec(path: str, run: _Run) -> int:
    """Run each rule of a SageMaker-shaped rules specification; the worst exit code."""
    with open(path, encoding="utf-8") as f:
        try:
            specs = json.load(f)
        except ValueError as exc:
            raise MltraceValueError(f"rules spec {path} is not JSON: {exc}") from None
    if isinstance(specs, dict):
        specs = [specs]
    worst = 0
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or "RuleName" not in spec:
            raise MltraceValueError(f"{path}[{i}] needs a RuleName")
        ignored = sorted(set(spec) & SAGEMAKER_ONLY_KEYS)
        if ignored:
            logger.warning("%s: %s only mean something on SageMaker; ignored",
                           spec["RuleName"], ", ".join(ignored))
        unknown = sorted(set(spec) - SPEC_KEYS - SAGEMAKER_ONLY_KEYS)
        if unknown:
            raise MltraceValueError(
                f"{path}[{i}]: unknown keys {unknown}; known: {sorted(SPEC_KEYS)}")
        given = spec.get("RuntimeConfigurations") or spec.get("RuleParameters") or {}
        config = {str(k): str(v) for k, v in given.items()}
        if "logging-level" in config:
            logging.getLogger("mltrace").setLevel(config.pop("logging-level").upper())
        this = replace(
            run, raise_cond=False,
            start=int(config.pop("start-step")) if "start-step" in config else run.start,
            end=int(config.pop("end-step")) if "end-step" in config else run.end,
            other=[p for p in config.pop("other-trials-paths", "").split(";") if p])
        params = {k.replace("-", "_"): v for k, v in config.items()}
        worst = max(worst, _run_one(this, spec["RuleName"], spec.get("SourceS3Uri") or None,
                                    params))
    return worst


#: The user-facing alternative to ``--mlflow-parent-run-id``, read by main() only (the run id
#: then travels to the MLflow rule listener as a listener option, never through the process
#: environment).
MLFLOW_PARENT_RUN_ENV = "MLTRACE_MLFLOW_PARENT_RUN_ID"


def _listener_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    parent = args.mlflow_parent_run_id or os.environ.get(MLFLOW_PARENT_RUN_ENV)
    return {"mlflow": {"parent_run_id": parent}} if parent else {}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 no issue, 1 condition met, 2 error)."""
    args, extra = _parser().parse_known_args(argv)
    from mltrace._logging import configure_from_env

    configure_from_env()  # MLTRACE_LOG_LEVEL; --logging-level below wins
    if args.logging_level:
        logging.getLogger("mltrace").setLevel(args.logging_level.upper())
    if not logging.getLogger().handlers and not logging.getLogger("mltrace").handlers:
        logging.basicConfig(level=logging.WARNING, format="[%(levelname)s %(name)s] %(message)s")
    from mltrace.exceptions import MltraceError

    run = _Run(args.trial_dir, start=args.start_step, end=args.end_step,
               action_str=args.action_str, wait=args.wait,
               progress=not args.no_progress and sys.stderr.isatty(),
               listener_options=_listener_options(args))
    try:
        params = _extra_params(extra)
        if args.rules_spec:
            return _run_spec(args.rules_spec, run)
        if not args.rule_name:
            raise MltraceValueError("pass --rule-name NAME (or --rules-spec FILE)")
        run.raise_cond = str(args.raise_rule_eval_cond_exception).lower() in ("true", "1", "yes")
        run.other = [p for p in args.other_trials.split(",") if p]
        return _run_one(run, args.rule_name, args.rule_file, params)
    except RuleEvaluationConditionMet:
        raise
    except MltraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
