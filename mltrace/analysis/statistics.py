"""A tensor's statistics at one step, and the one way a list of steps is thinned.

Statistics are reductions (``mltrace.reductions`` defines each one once): a stored reduction is
read when the step has it, otherwise the same reduction is computed from the saved raw value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from mltrace.exceptions import (
    CorruptRecordError,
    InvalidWorker,
    MltraceTypeError,
    TensorUnavailableForStep,
)
from mltrace.modes import ModeKeys
from mltrace.reductions import as_numeric, compute_many, parse_statistic, statistic_name

if TYPE_CHECKING:
    from mltrace.trials.tensor import Tensor

T = TypeVar("T")

#: Errors of one step's record (damaged, or a dtype this mltrace cannot read): a view leaves the
#: step out, says so, and shows the others, instead of failing as a whole.
UNREADABLE: tuple[type[Exception], ...] = (CorruptRecordError, MltraceTypeError)
#: What is computed from a raw value when a step stored no reduction and nothing else is asked for.
RAW_STATISTICS = ("min", "max", "mean", "std", "l1", "l2", "nan_count", "inf_count")
#: The key of a one-element tensor's own value (a loss, a metric): its reductions are itself.
VALUE = "value"


def thin(items: Sequence[T], limit: int | None) -> list[T]:
    """``items`` evenly thinned to at most ``limit``, the first and the last always kept.

    Every view thins the same way, so a chart, a summary and a comparison of one run show the
    same steps. ``limit`` None (or 0) keeps all; 1 keeps the last, the most recent step.

    Example:
        >>> thin(list(range(10)), 4)
        [0, 3, 6, 9]
    """
    if not limit or len(items) <= limit:
        return list(items)
    if limit < 2:
        return [items[-1]]
    idx = np.unique(np.linspace(0, len(items) - 1, limit).round().astype(int))
    return [items[i] for i in idx]


def _as_float(value: np.ndarray) -> float:
    """The first element of a stored reduction as a float (NaN when it is not a number)."""
    arr = as_numeric(value)
    return (
        float(np.real(arr.reshape(-1)[0]))
        if arr.dtype.kind in "biufc" and arr.size
        else float("nan")
    )


def _stored(tensor: Tensor, step: int, mode: ModeKeys, worker: str | None) -> dict[str, float]:
    try:
        stored = tensor.reduction_values(step, mode, worker)
    except InvalidWorker:  # the worker saved nothing at this step
        return {}
    return {statistic_name(name, is_abs): _as_float(v) for (name, is_abs), v in stored.items()}


def value_statistics(value: np.ndarray, names: Sequence[str] = RAW_STATISTICS) -> dict[str, float]:
    """Statistics ``names`` of a raw value, by mltrace.reductions' definitions, as floats (the real
    part of a complex one); empty for an empty or non-numeric value."""
    return {n: float(np.real(v)) for n, v in compute_many(value, names).items()}


def step_statistics(
    tensor: Tensor,
    step: int,
    mode: ModeKeys = ModeKeys.GLOBAL,
    worker: str | None = None,
    names: Sequence[str] | None = None,
) -> dict[str, float] | None:
    """A tensor's statistics at one step, ``{statistic: value}``.

    With ``names`` None it answers what the step has, cheaply: the reductions stored at the step
    when there are any (the raw value is then not read); else, from the raw value, ``{"value": x}``
    for a one-element tensor or RAW_STATISTICS for a larger one. With ``names`` (``mean``,
    ``abs_max``, ...) it answers those: each stored one, the others computed from the raw value
    (read once); a name neither gives is left out.

    Args:
        tensor: a Tensor of a trial.
        step: a step of ``mode``.
        mode: the mode of ``step``.
        worker: the worker whose data is read (default: the step's first).
        names: statistics wanted, or None for what the step has.

    Returns:
        the statistics, or None when the step (or worker) has none of them.

    Raises:
        MltraceValueError: an unknown statistic name.
        CorruptRecordError, MltraceTypeError: the step's record cannot be read (UNREADABLE).
    """
    wanted = {n: statistic_name(*parse_statistic(n)) for n in names or ()}
    stored = _stored(tensor, step, mode, worker)
    if names is None and stored:
        return stored
    out = {n: stored[key] for n, key in wanted.items() if key in stored}
    missing = [n for n in wanted if n not in out]
    if names is None or missing:
        try:
            value = as_numeric(tensor.value(step, mode, worker))
        except (TensorUnavailableForStep, InvalidWorker):
            return out or None
        if names is None and value.size == 1 and value.dtype.kind in "biuf":
            return {VALUE: float(value.reshape(-1)[0])}
        out.update(value_statistics(value, RAW_STATISTICS if names is None else missing))
    return out or None
