"""What the built-in rules share: choosing tensors, reading values that may be missing at a step,
and finding earlier saved steps without listing a long run's history again at every step."""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING, Any

import numpy as np

from mltrace.exceptions import VALUE_UNAVAILABLE, MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_names, as_regex_list

if TYPE_CHECKING:
    from mltrace.rules.rule import Rule
    from mltrace.trials import Trial
    from mltrace.trials.tensor import Tensor

logger = logging.getLogger(__name__)

#: Tensors that look like losses when no losses collection exists (smdebug's tests relied on it).
LOSS_REGEX = "(?i)loss"


def value_at(tensor: Tensor, step: int, mode: ModeKeys = ModeKeys.GLOBAL) -> np.ndarray | None:
    """The raw value of ``tensor`` at ``step`` (of ``mode``), or None where it was not saved."""
    try:
        return tensor.value(step, mode)
    except VALUE_UNAVAILABLE:
        return None


def scalar_at(tensor: Tensor, step: int, mode: ModeKeys = ModeKeys.GLOBAL) -> float | None:
    """A scalar (one-element) value as a float; None where missing or not a scalar."""
    value = value_at(tensor, step, mode)
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.size != 1 or arr.dtype.kind not in "biuf":
        return None
    return float(arr.reshape(()))


def reduction_at(tensor: Tensor, step: int, name: str, abs: bool = False,
                 mode: ModeKeys = ModeKeys.GLOBAL) -> float | None:
    """A reduction, stored or computed from the raw value; None where neither was saved."""
    try:
        return float(tensor.reduction_value(step, name, mode=mode, abs=abs))
    except VALUE_UNAVAILABLE:
        return None


def stored_reduction(tensor: Tensor, step: int, name: str, abs: bool = False) -> float | None:
    """A reduction the hook stored at global ``step``, never computed from the raw tensor (so
    no raw value is read); None when it was not stored."""
    stored = tensor.trial.index_entries(tensor.name).reductions.get(step)
    if not stored or (name, abs) not in stored[min(stored)]:
        return None
    return reduction_at(tensor, step, name, abs)


def has_value(tensor: Tensor, step: int) -> bool:
    """True if the raw value of ``tensor`` was saved at global ``step`` (no read)."""
    return step in tensor.trial.index_entries(tensor.name).values


class TensorSelection:
    """The tensors a rule inspects: the union of collections and regexes (smdebug's
    ``collection_names`` / ``tensor_regex``), re-evaluated only when new tensor names appear.

    Args:
        rule: the rule's name, for messages.
        collection_names: collections that must exist in the trial.
        tensor_regex: regexes (``re.search``).
        optional_collections: collections used when they exist (e.g. ``losses``).
        fallback_regex: used when all of the above select nothing.
        everything_when_empty: select every tensor when nothing at all is configured.
    """

    def __init__(self, rule: str, collection_names: list[str], tensor_regex: list[str],
                 optional_collections: tuple[str, ...] = (),
                 fallback_regex: list[str] | None = None,
                 everything_when_empty: bool = False) -> None:
        self.rule = rule
        self.collection_names = list(collection_names)
        self.tensor_regex = list(tensor_regex)
        self.optional_collections = optional_collections
        self.fallback_regex = fallback_regex or []
        self.everything = everything_when_empty and not collection_names and not tensor_regex
        self._cache: dict[int, tuple[int, list[str]]] = {}

    def check(self, trial: Trial) -> None:
        """Raise MltraceValueError for a configured collection the trial does not have."""
        known = trial.collections()
        unknown = [c for c in self.collection_names if c not in known]
        if unknown:
            raise MltraceValueError(
                f"{self.rule}: collection(s) {', '.join(unknown)} not in trial {trial.name!r}; "
                f"it has {', '.join(sorted(known))}"
            )

    def names(self, trial: Trial) -> list[str]:
        """Selected tensor names (sorted)."""
        version = trial.tensor_count()
        hit = self._cache.get(id(trial))
        if hit is not None and hit[0] == version:
            return hit[1]
        if self.everything:
            names = set(trial.tensor_names())
        else:
            names = set()
            known = trial.collections()
            for coll in [*self.collection_names, *self.optional_collections]:
                if coll in known:
                    names.update(trial.tensor_names(collection=coll))
            if self.tensor_regex:
                names.update(trial.tensor_names(regex=self.tensor_regex))
            if not names and self.fallback_regex:
                names.update(trial.tensor_names(regex=self.fallback_regex))
        result = sorted(names)
        self._cache[id(trial)] = (version, result)
        return result

    def tensors(self, trial: Trial, rule: Rule | None = None) -> list[Tensor]:
        """Selected tensors; with ``rule``, also reported to it as the tensors it checks at this
        step (none at all over a whole execution makes its status NothingChecked)."""
        names = self.names(trial)
        if rule is not None:
            rule.note_checked(names)
        return [trial.tensor(n) for n in names]


def selection_from(rule: str, trial: Trial, collection_names: Any, tensor_regex: Any,
                   required: bool = False, **options: Any,
                   ) -> tuple[list[str], list[str], TensorSelection]:
    """A rule's ``collection_names`` and ``tensor_regex`` arguments, parsed, and the selection
    they make, its collections checked against ``trial``: (collection names, regexes, selection).

    Args:
        rule: the rule's name, for messages.
        trial: the trial the collections must exist in.
        collection_names, tensor_regex: the rule's arguments as given (lists or strings).
        required: one of the two must be given (rules with no default selection).
        **options: TensorSelection's further arguments (``optional_collections``, ...).

    Raises:
        MltraceValueError: an invalid argument, a collection the trial lacks, or neither given
            where ``required``.
    """
    names = as_names(collection_names)
    regexes = as_regex_list(rule, "tensor_regex", tensor_regex)
    if required and not names and not regexes:
        raise MltraceValueError(
            f"{rule}: pass collection_names or tensor_regex (or both: the union is inspected)"
        )
    selection = TensorSelection(rule, names, regexes, **options)
    selection.check(trial)
    return names, regexes, selection


class SavedSteps:
    """Per tensor and mode, the sorted steps where its value was saved, listed again only when the
    trial has read new steps: finding the previous saved step stays logarithmic on long runs."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, str, ModeKeys], tuple[int, list[int]]] = {}

    def steps(self, tensor: Tensor, mode: ModeKeys) -> list[int]:
        """Saved steps of ``tensor`` in ``mode`` (mode steps; global steps for GLOBAL)."""
        trial = tensor.trial
        key = (id(trial), tensor.name, mode)
        version = len(trial.saved_steps())
        hit = self._cache.get(key)
        if hit is None or hit[0] != version:
            values = trial.index_entries(tensor.name).values
            steps = [s for s in tensor.steps(mode) if trial.to_global_step(s, mode) in values]
            hit = (version, steps)
            self._cache[key] = hit
        return hit[1]

    def before(self, tensor: Tensor, mode: ModeKeys, step: int, n: int | None = None) -> list[int]:
        """The last ``n`` (all when None) saved steps strictly before ``step``."""
        steps = self.steps(tensor, mode)
        end = bisect_left(steps, step)
        return steps[max(0, end - n):end] if n is not None else steps[:end]

    def at_or_before(self, tensor: Tensor, mode: ModeKeys, step: int) -> int | None:
        """The newest saved step <= ``step``, or None."""
        steps = self.steps(tensor, mode)
        i = bisect_right(steps, step)
        return steps[i - 1] if i else None


def mode_of(trial: Trial, step: int) -> tuple[ModeKeys, int]:
    """(mode, mode step) of global ``step``; (GLOBAL, step) when the trial does not know it."""
    mode, mode_step = trial.mode_modestep(step)
    if mode is None or mode_step is None:
        return ModeKeys.GLOBAL, step
    return mode, mode_step


def units_fraction(mask: np.ndarray) -> np.ndarray | None:
    """Per unit, the fraction of samples where ``mask`` holds.

    A unit is a position of axis 1 (a neuron of a dense layer, a channel of a convolution in
    NCHW); the fraction runs over the samples of axis 0 and every remaining position. A 1-D
    tensor is one sample. None for a scalar or an empty tensor.
    """
    arr = np.asarray(mask, dtype=bool)
    if arr.ndim == 0 or arr.size == 0:
        return None
    if arr.ndim == 1:
        return arr.astype(np.float64)
    per_unit = np.moveaxis(arr, 1, 0).reshape(arr.shape[1], -1)
    return per_unit.mean(axis=1)


def other_global_step(other: Trial, mode: ModeKeys, mode_step: int) -> int | None:
    """The global step of (mode, mode step) in another trial, refreshing a live one once; None
    when that trial has not saved it (yet)."""
    found = other.to_global_step(mode_step, mode)
    if found is None and not other.loaded_all_steps:
        other.maybe_refresh(force=True)
        found = other.to_global_step(mode_step, mode)
    return found
