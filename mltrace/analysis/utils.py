"""smdebug's ``smdebug.analysis.utils`` refresh switches, at the same place: ``no_refresh`` and
``refresh`` (smdebug's documented way to hold a trial still while a rule or a notebook reads it).

Each takes one trial or a list of trials and yields what it was given, as smdebug's do, so that
``with no_refresh(trial) as t:`` works; on leaving, each trial's ``dynamic_refresh`` is put back
to what it was before the block, also when the block raises (smdebug set the opposite value on a
normal exit only, so that a ``refresh`` block alone left refreshing off afterwards).

Example:
    >>> from mltrace.analysis.utils import no_refresh
    >>> with no_refresh([trial, baseline]):
    ...     values = [t.tensor(name).value(step) for t in (trial, baseline)]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, TypeVar

from mltrace.exceptions import MltraceTypeError

if TYPE_CHECKING:
    from mltrace.trials import Trial

#: a Trial or a sequence of Trials, yielded back as given
T = TypeVar("T")


def _as_list(trials: object, where: str) -> list[Trial]:
    from mltrace.trials import Trial  # the reader imports nothing from here; no cycle at import

    items = [trials] if isinstance(trials, Trial) else trials
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not all(
            isinstance(t, Trial) for t in items):
        raise MltraceTypeError(
            f"{where}({trials!r}): pass a trial or a list of trials from "
            "mltrace.trials.create_trial(path)")
    return list(items)


@contextmanager
def _switched(trials: T, value: bool, where: str) -> Iterator[T]:
    items = _as_list(trials, where)
    saved = [t.dynamic_refresh for t in items]
    for t in items:
        t.dynamic_refresh = value
    try:
        yield trials
    finally:
        for t, before in zip(items, saved):
            t.dynamic_refresh = before


def no_refresh(trials: T) -> AbstractContextManager[T]:
    """Within the block, queries on ``trials`` do not look for new files: one consistent view
    (rules use it while they evaluate a step). Waiting calls such as ``wait_for_steps`` still
    look, as smdebug's do.

    Args:
        trials: a Trial or a list of Trials to hold still.

    Returns:
        a context manager that turns each trial's ``dynamic_refresh`` off, yields ``trials`` as
        given, and puts each trial's previous setting back on leaving.

    Raises:
        MltraceTypeError: ``trials`` is neither a trial nor a list of trials.
    """
    return _switched(trials, False, "no_refresh")


def refresh(trials: T) -> AbstractContextManager[T]:
    """Within the block, queries on ``trials`` look for new files again (inside a
    ``no_refresh`` block, for example): ``no_refresh``'s mirror, with the same argument, the
    same yield (``trials`` as given), the same restoring of each trial's previous
    ``dynamic_refresh`` on leaving, and the same MltraceTypeError for anything but a trial or a
    list of trials.
    """
    return _switched(trials, True, "refresh")


__all__ = ["no_refresh", "refresh"]
