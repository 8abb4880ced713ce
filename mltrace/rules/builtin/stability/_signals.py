"""What the stability rules share: finding a signal collection's tensors, reading their values
once per step, the trailing windows and running states they are judged by, and the wording of
findings.

A rule run over a whole trial is invoked step after step in increasing order; a ``History``
then reads each value once and keeps only the newest values of each series, enough for the next
window. A rule invoked on an earlier step (out of order, or a second pass) reads the window's
steps from the trial again, so every answer is the one an in-order run gives.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from itertools import islice
from typing import Any, Generic, TypeVar

import numpy as np

from mltrace.exceptions import (
    VALUE_UNAVAILABLE,
    InvalidWorker,
    MltraceValueError,
    TensorUnavailable,
)
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_int, check_range
from mltrace.rules.rule import Rule
from mltrace.stability.signals import (
    GRAD_NORMS,
    LOGITS,
    OPTIMIZER_STATE,
    PREFIXES,
    STABILITY,
    UPDATES,
    collection_regex,
    layer_of,
    parse_signal,
)
from mltrace.stability.windows import SeriesHistory, as_vector, stack, window_median
from mltrace.trials import Trial

#: A finding message lists at most this many findings of one step (then "and N more").
MAX_FINDINGS = 5

S = TypeVar("S")


# -- parameters --------------------------------------------------------------------------------
def int_param(rule: str, name: str, value: Any, low: int, high: int | None = None) -> int:
    """An integer parameter within [low, high] (strings accepted, as SageMaker passes them)."""
    number = as_int(rule, name, value)
    check_range(rule, name, number, low, high)
    return number


def check_min_history(rule: str, min_history: int, window: int, low: int = 2) -> None:
    """``min_history`` (already checked to be at least ``low``) must fit in the window it is
    counted in."""
    if min_history > window:
        raise MltraceValueError(f"{rule}: parameter min_history={min_history!r} must lie in "
                                f"[{low}, window={window}]")


# -- which tensors -----------------------------------------------------------------------------
def how_to_record(collection: str) -> str:
    """The advice that ends a missing-signal message."""
    return (f"record it with include_collections=['{STABILITY}'] (or ['{collection}']) on the "
            "PyTorch hook")


def require_collection(rule: str, trial: Trial, collection: str, what: str) -> None:
    """Check that ``trial`` can hold the tensors of signal ``collection``: it has that collection
    or the ``stability`` one, or already holds a tensor named with the collection's prefix.

    Raises:
        MltraceValueError: none of these, naming what to record and how.
    """
    known = trial.collections()
    if collection in known or STABILITY in known:
        return
    if trial.tensor_names(regex=collection_regex(collection)):
        return
    raise MltraceValueError(
        f"{rule} needs the {collection} collection ({what}, tensors {PREFIXES[collection]}...) "
        f"and trial {trial.name!r} has neither it nor any such tensor: {how_to_record(collection)}"
    )


class SignalNames:
    """The tensors of one signal collection and quantity (None: tensors without one, the grad
    norms), listed again only when new tensor names appear."""

    def __init__(self, collection: str, quantity: str | None) -> None:
        self.collection = collection
        self.quantity = quantity
        self._cache: tuple[int, list[str]] | None = None

    def names(self, trial: Trial) -> list[str]:
        """The matching tensor names of ``trial``, sorted."""
        version = trial.tensor_count()
        if self._cache is None or self._cache[0] != version:
            names = []
            for name in trial.tensor_names(regex=collection_regex(self.collection)):
                signal = parse_signal(name)
                if (signal is not None and signal.collection == self.collection
                        and signal.quantity == self.quantity):
                    names.append(name)
            self._cache = (version, sorted(names))
        return self._cache[1]


def global_grad_norms(names: list[str]) -> set[str]:
    """The model-wide norms among grad-norm tensor names: ``grad_norm/<model>`` is one unless
    its subject is another subject followed by ``_`` and more (``grad_norm/GPT_h.0.w`` is
    parameter ``h.0.w`` of model ``GPT`` when ``grad_norm/GPT`` exists). A model saved without
    per-parameter norms has model-wide norms only."""
    subjects = {n: s.subject for n in names if (s := parse_signal(n)) is not None}
    known = set(subjects.values())
    found = set()
    for name, subject in subjects.items():
        cuts = [i for i, c in enumerate(subject) if c == "_" and i > 0]
        if not any(subject[:i] in known for i in cuts):
            found.add(name)
    return found


def grad_norm_names(trial: Trial, selection: SignalNames) -> tuple[list[str], set[str]]:
    """The grad-norm tensors of ``selection`` (made for the grad_norms collection) and which of
    them are model-wide."""
    names = selection.names(trial)
    return names, global_grad_norms(names)


# -- values and windows ------------------------------------------------------------------------
def step_mode(trial: Trial, step: int) -> ModeKeys:
    """The mode of global ``step`` (GLOBAL when the trial does not know it)."""
    mode = trial.mode_modestep(step)[0]
    return ModeKeys.GLOBAL if mode is None else mode


class History:
    """The values of a trial's tensors, per series (a tensor's values in one mode, optionally of
    one worker), read once and kept while a later window may need them.

    Args:
        trial: the trial to read.
        keep: the values kept per series: the longest window a rule reads, plus the current
            step.
    """

    def __init__(self, trial: Trial, keep: int) -> None:
        self.trial = trial
        self.keep = max(2, keep)
        self._series: dict[tuple[str, ModeKeys, str | None], SeriesHistory] = {}
        self._steps: dict[tuple[str, ModeKeys], tuple[int, list[int]]] = {}

    def steps(self, name: str, mode: ModeKeys) -> list[int]:
        """The global steps of ``mode`` where tensor ``name`` was saved (its raw value), sorted.
        Steps the trial has read since the last call are added to the list kept (the index
        keeps steps in the order it read them), so a live trial's list is not rebuilt."""
        trial = self.trial
        values = trial.index_entries(name).values
        seen, steps = self._steps.get((name, mode), (0, []))
        if len(values) == seen:
            return steps
        if len(values) < seen:  # cannot happen with an index that only grows: start again
            seen, steps = 0, []
        for g in islice(values, seen, None):
            if step_mode(trial, g) is mode:
                if not steps or g > steps[-1]:
                    steps.append(g)
                else:
                    insort(steps, g)
        self._steps[(name, mode)] = (len(values), steps)
        return steps

    def steps_before(self, name: str, step: int, n: int) -> list[int]:
        """The last ``n`` saved steps of ``name`` before global ``step``, in ``step``'s mode."""
        steps = self.steps(name, step_mode(self.trial, step))
        end = bisect_left(steps, step)
        return steps[max(0, end - n):end]

    def value(self, name: str, step: int, worker: str | None = None) -> np.ndarray | None:
        """The value of ``name`` at global ``step`` as a float64 vector (by ``worker``, else the
        first worker that saved it); None where it was not saved or is not numeric."""
        key = (name, step_mode(self.trial, step), worker)
        series = self._series.get(key)
        if series is not None and step in series:
            return series.get(step)
        try:
            by_worker = self.trial.index_entries(name).values.get(step)
        except TensorUnavailable:  # a tensor the trial does not hold (yet)
            return None
        if not by_worker or (worker is not None and worker not in by_worker):
            return None
        try:
            raw = np.asarray(self.trial.tensor(name).value(step, worker=worker))
        except (*VALUE_UNAVAILABLE, InvalidWorker):
            return None
        if raw.size == 0 or raw.dtype.kind not in "biuf":
            return None
        value = as_vector(raw)
        if series is None:
            series = self._series[key] = SeriesHistory(self.keep)
        series.add(step, value)
        return value

    def window(self, name: str, step: int, n: int, worker: str | None = None) -> np.ndarray:
        """The values of ``name`` at its last ``n`` saved steps before ``step`` (in ``step``'s
        mode), ``stack``-ed oldest first (non-finite entries NaN); steps whose value cannot be
        read, or differs in size from the others, are left out."""
        mode = step_mode(self.trial, step)
        steps = self.steps(name, mode)
        end = bisect_left(steps, step)
        series = self._series.get((name, mode, worker))
        rows = []
        for s in steps[max(0, end - n):end]:
            value = series.get(s) if series is not None else None
            if value is None:
                value = self.value(name, s, worker)
            if value is not None:
                rows.append(value)
        if rows and any(r.size != rows[-1].size for r in rows):
            rows = [r for r in rows if r.size == rows[-1].size]
        return stack(rows)

    def scalar(self, name: str, step: int, worker: str | None = None) -> float | None:
        """A one-element value as a float; None where missing or not a scalar."""
        value = self.value(name, step, worker)
        return float(value[0]) if value is not None and value.size == 1 else None


class Running(Generic[S]):
    """A state folded over each series' values in step order (a running maximum, an EMA).

    ``before(name, step)`` returns the state after every saved step of the series before
    ``step``: advanced from where the last call left it when ``step`` is later, rebuilt from the
    series' first step when it is not (a rule invoked out of order reads the earlier values
    again; the answer is the same).

    Args:
        history: where the values come from.
        start: a new state.
        fold: ``fold(state, name, step, value)`` returns the state after ``value``.
    """

    def __init__(self, history: History, start: Callable[[], S],
                 fold: Callable[[S, str, int, np.ndarray], S]) -> None:
        self.history = history
        self.start = start
        self.fold = fold
        self._states: dict[tuple[str, ModeKeys], tuple[int | None, S]] = {}

    def before(self, name: str, step: int) -> S:
        """The state over the saved steps of ``name`` before ``step`` (in ``step``'s mode)."""
        mode = step_mode(self.history.trial, step)
        last, state = self._states.get((name, mode), (None, None))
        if last is None or state is None or last >= step:
            last, state = None, self.start()
        steps = self.history.steps(name, mode)
        first = 0 if last is None else bisect_right(steps, last)
        for s in steps[first:bisect_left(steps, step)]:
            value = self.history.value(name, s)
            if value is not None:
                state = self.fold(state, name, s, value)
            last = s
        self._states[(name, mode)] = (last, state)
        return state


# -- findings ----------------------------------------------------------------------------------
#: What a signal's subject is, per collection, in a finding.
_SUBJECT_KIND = {GRAD_NORMS: "parameter", UPDATES: "parameter", OPTIMIZER_STATE: "parameter",
                 LOGITS: "model"}


def where(name: str, head: int | None = None, model_wide: bool = False) -> str:
    """How a finding names a signal: the tensor, the head, the module, parameter or model and
    its layer (``attention/blocks.0.attn/max_logit head 3 (module blocks.0.attn, layer
    blocks.0)``); ``model_wide`` for a model's global gradient norm."""
    signal = parse_signal(name)
    text = name if head is None else f"{name} head {head}"
    if signal is None:
        return text
    if model_wide:
        return f"{text} (model {signal.subject}, all parameters)"
    kind = _SUBJECT_KIND.get(signal.collection, "module")
    layer = layer_of(signal.subject)
    return f"{text} ({kind} {signal.subject}" + (f", layer {layer})" if layer else ")")


def fmt(x: float) -> str:
    """A number in a finding."""
    return f"{x:.4g}" if math.isfinite(x) else str(x)


class StabilityRule(Rule):
    """The base of the stability rules: a ``History`` of what they read, and one message for the
    findings of a step."""

    def __init__(self, base_trial: Trial, action_str: Any, keep: int) -> None:
        super().__init__(base_trial, action_str=action_str)
        self._history = History(base_trial, keep)

    def set_window(self, size: int, min_history: Any) -> None:
        """The trailing window (``size`` steps, parsed before the history is made) and the
        warm-up ``min_history`` in [2, size] the rule judges by."""
        self.window = size
        self.min_history = int_param(self.rule_name, "min_history", min_history, 2)
        check_min_history(self.rule_name, self.min_history, size)

    def trailing(self, name: str, step: int, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The window of ``name`` before ``step`` (its last ``window`` saved values,
        ``stack``-ed) and, per element of ``value``, its median over that window: NaN for an
        element with fewer than ``min_history`` finite values there (still warming up), or when
        the window's values differ in size from ``value`` (a model whose number of heads
        changed). ``window`` and ``min_history`` are the rule's (see :meth:`set_window`)."""
        window = self._history.window(name, step, self.window)
        if window.shape[0] == 0 or window.shape[1] != value.size:
            return np.zeros((0, value.size)), np.full(value.size, np.nan)
        median = window_median(window)
        median[np.isfinite(window).sum(axis=0) < self.min_history] = np.nan
        return window, median

    def report_findings(self, step: int, findings: list[str]) -> bool:
        """Set the message for ``findings`` at ``step`` (each "<where>: <what>"); True when
        there is any."""
        if not findings:
            return False
        more = len(findings) - MAX_FINDINGS
        text = "; ".join(findings[:MAX_FINDINGS]) + (f"; and {more} more" if more > 0 else "")
        self.last_message = f"{len(findings)} finding(s) at {self.step_label(step)}: {text}"
        return True

    def signal_tensors(self, names: list[str], step: int) -> list[str]:
        """``names`` that hold a value at ``step``, reported as the tensors checked."""
        self.note_checked(names)
        trial = self.base_trial
        return [n for n in names if step in trial.index_entries(n).values]


def per_head(values: np.ndarray) -> list[tuple[int | None, float]]:
    """(head index, value) of a signal's value: heads for a vector, None for a scalar."""
    if values.size == 1:
        return [(None, float(values[0]))]
    return [(h, float(v)) for h, v in enumerate(values)]


__all__ = [
    "History", "MAX_FINDINGS", "Running", "SignalNames", "StabilityRule", "check_min_history",
    "fmt", "global_grad_norms", "grad_norm_names", "how_to_record", "int_param",
    "per_head", "require_collection", "step_mode", "where",
]
