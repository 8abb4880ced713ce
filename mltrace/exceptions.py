"""mltrace's exceptions: smdebug's names and fields, each also the matching builtin.

Every message says what went wrong, with the value, and how to fix it. Readers raise the
smdebug-named exceptions (StepUnavailable, TensorUnavailableForStep, NoMoreData, ...) so that rules
and notebooks written for smdebug catch them unchanged.
"""

from __future__ import annotations

from typing import Any

from mltrace.modes import ModeKeys


class MltraceError(Exception):
    """Base class of every error mltrace raises on purpose."""


class MltraceValueError(MltraceError, ValueError):
    """A value (configuration, argument, name) is invalid; the message names it and the fix."""


class MltraceTypeError(MltraceError, TypeError):
    """A value has a type mltrace cannot handle (e.g. an object array to save)."""


class MltraceRuntimeError(MltraceError, RuntimeError):
    """An operation cannot go on in the current state (e.g. out_dir holds a finished run)."""


class MltraceAttributeError(MltraceError, AttributeError):
    """An attribute that does not exist was set, e.g. a typo such as ``save_config.save_intervl``
    (which would otherwise be silently ignored); the message lists the valid names."""


class InvalidCollectionConfiguration(MltraceValueError):
    """A collection would match nothing: it has neither include regexes nor tensor names."""

    def __init__(self, collection_name: str, problem: str | None = None, did_you_mean: str | None = None) -> None:
        self.collection_name = collection_name
        if problem is None:
            problem = (
                f"collection {collection_name!r} has no include_regex and no tensor_names, so it "
                "matches no tensor: call collection.include('<regex>') or add_tensor_name('<name>') "
                "(or add_module_tensors for a module) before training"
            )
        if did_you_mean:
            problem += f" (did you mean the collection {did_you_mean!r}?)"
        super().__init__(problem)


class CorruptRecordError(MltraceError, ValueError):
    """A record in an events file is truncated or fails its CRC."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(
            f"corrupt record in {where}: {problem}; the file was damaged after writing (or is "
            "still being written by a crashed process): delete or restore it"
        )


class IndexReaderException(MltraceError, ValueError):
    """An index file is empty, not JSON, or not shaped like smdebug's index."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class MissingCollectionFiles(MltraceError, RuntimeError):
    """No collections file appeared under the trial within the wait allowed."""

    def __init__(self, path: str = "", waited: float | None = None,
                 has_steps: bool = False) -> None:
        self.path = path
        self.has_steps = has_steps
        hint = f" after waiting {waited:.1f}s" if waited is not None else ""
        if has_steps:  # the data is there, only the collections file is gone
            super().__init__(
                f"trial {path!r} has index files but no collections/000000000/*_collections.json"
                f"{hint}: the collections file was deleted or lost; restore it from the training "
                "job's output (the hook writes it at its first step and again at close)"
            )
            return
        super().__init__(
            f"no trial data at {path!r}{hint}: expected collections/000000000/*_collections.json. "
            "Check the path (it is the hook's out_dir), or pass a longer wait, e.g. "
            "create_trial(path, timeout=60), if training has not saved its first step yet"
        )


class TensorUnavailable(MltraceError, KeyError):
    """The trial holds no tensor of this name (yet)."""

    def __init__(self, tname: str) -> None:
        self.tname = tname
        super().__init__(f"tensor {tname!r} is not in this trial; see trial.tensor_names()")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class TensorUnavailableForStep(MltraceError, LookupError):
    """The tensor exists but was not saved at this step (maybe only its reductions were)."""

    def __init__(self, tname: str, step: int, mode: Any = None, has_reductions: bool = False):
        self.tname = tname
        self.step = step
        self.mode = ModeKeys.GLOBAL if mode is None else mode
        self.has_reductions = has_reductions
        msg = f"value for tensor {tname!r} is not available for step {step} in mode {self.mode.name}"
        if has_reductions:
            msg += "; only its reductions were saved: use tensor.reduction_value(step, name)"
        super().__init__(msg)


class ShapeUnavailableForStep(MltraceError, LookupError):
    """Neither the shape nor the value of the tensor was saved at this step."""

    def __init__(self, tname: str, step: int, mode: Any = None) -> None:
        self.tname, self.step = tname, step
        self.mode = ModeKeys.GLOBAL if mode is None else mode
        super().__init__(f"shape of {tname!r} is not available for step {step} ({self.mode.name})")


class StepUnavailable(MltraceError, LookupError):
    """The step was never saved (a later step is already complete)."""

    def __init__(self, step: int, mode: Any = None) -> None:
        self.step = step
        self.mode = ModeKeys.GLOBAL if mode is None else mode
        super().__init__(f"step {step} of mode {self.mode.name} was not saved")


class StepNotYetAvailable(MltraceError, LookupError):
    """The step may still appear: training has not finished or passed it."""

    def __init__(self, step: int, mode: Any = None) -> None:
        self.step = step
        self.mode = ModeKeys.GLOBAL if mode is None else mode
        super().__init__(f"step {step} of mode {self.mode.name} is not available yet")


class NoMoreData(MltraceError, RuntimeError):
    """Training has ended and the step asked for lies beyond its last saved step."""

    def __init__(self, step: int | None = None, mode: Any = None, last_step: int | None = None):
        self.step = step
        self.mode = ModeKeys.GLOBAL if mode is None else mode
        self.last_step = last_step
        super().__init__(
            f"no more data: training has ended (last step {last_step}) and step {step} of mode "
            f"{self.mode.name} will never be saved"
        )


#: What reading a value that is not there raises: the tensor was not saved at the step, the
#: step was skipped, is not written yet, or lies past the end of training. Rules and notebooks
#: that read many tensors at many steps catch these (``except VALUE_UNAVAILABLE:``) and go on.
VALUE_UNAVAILABLE = (TensorUnavailableForStep, TensorUnavailable, StepUnavailable,
                     StepNotYetAvailable, NoMoreData)


class InvalidWorker(MltraceError, ValueError):
    """A worker name that the trial does not know."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        super().__init__(f"worker {worker!r} is not in this trial; see trial.workers()")


class TrialWriteError(MltraceError, OSError):
    """A file of the trial (or of its TensorBoard export) could not be written, e.g. a full disk.

    Only hooks built with ``strict=True`` raise it, from their next call after the background
    write failed, or from ``close()``; other hooks log the failure once and go on (see
    mltrace.writer). ``location`` is the file, ``cause`` what the storage raised.
    """

    def __init__(self, location: str, cause: BaseException) -> None:
        self.location = location
        self.cause = cause
        super().__init__(
            f"could not write {location}: {type(cause).__name__}: {cause}; free space or fix "
            "the storage (a hook with strict=False logs this once, keeps training and writes "
            "the next steps when it can)"
        )


class StopTrainingRequested(MltraceError):
    """A rule asked training to stop; raised by hooks at a step boundary, after every file of the
    trial was written and the hook closed. Catch it around your loop to end training cleanly."""

    def __init__(self, rule_name: str, step: int | None, message: str = "") -> None:
        self.rule_name = rule_name
        self.step = step
        super().__init__(
            f"rule {rule_name} asked training to stop (its condition held at step {step})"
            + (f": {message}" if message else "") + "; all data saved so far is in the trial"
        )


class RuleEvaluationConditionMet(MltraceError):
    """Raised by Rule.invoke when the rule's condition holds at ``step``."""

    def __init__(self, rule_name: str, step: int, end_of_rule: bool = False) -> None:
        self.rule_name = rule_name
        self.step = step
        self.end_of_rule = end_of_rule
        super().__init__(f"evaluation of the rule {rule_name} at step {step} resulted in True")


class InsufficientInformationForRuleInvocation(MltraceError):
    """A rule cannot be evaluated with the data the trial holds."""

    def __init__(self, rule_name: str, message: str) -> None:
        self.rule_name = rule_name
        super().__init__(f"not enough information to invoke rule {rule_name}: {message}")
