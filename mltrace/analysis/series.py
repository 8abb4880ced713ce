"""A tensor's statistics over the steps of one mode, for one worker: what every chart, summary and
comparison of mltrace draws.

Steps are read one by one through the trial's index, so none is sampled away unless the caller
asks for at most ``max_points`` (then :func:`~mltrace.analysis.statistics.thin` picks them and the
series says how many there were). A step whose record cannot be read is left out and listed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mltrace.analysis.cache import LruCache
from mltrace.analysis.statistics import UNREADABLE, step_statistics, thin
from mltrace.modes import ModeKeys

if TYPE_CHECKING:
    from mltrace.trials import Trial

logger = logging.getLogger(__name__)

StepRows = dict[int, "dict[str, float] | None"]


@dataclass(frozen=True)
class Damaged:
    """A step left out of a series or of histograms because its record cannot be read."""

    step: int
    error: str


@dataclass
class Coverage:
    """Which of a tensor's steps a view read: all of them, or ``read`` of ``total`` after thinning,
    less the ``damaged`` ones, whose records cannot be read."""

    total: int = 0
    read: int = 0
    damaged: list[Damaged] = field(default_factory=list)

    @property
    def thinned(self) -> bool:
        """True when steps were left out to keep at most the number the caller asked for."""
        return self.read < self.total


@dataclass
class Series:
    """One tensor's statistics over the steps of one mode.

    Attributes:
        steps: the mode steps that have statistics, ascending.
        global_steps: their global steps (the x axis all modes share, as in the TensorBoard export).
        values: ``{statistic: [value or None, ...]}`` aligned with ``steps``.
        coverage: how many steps there were, how many were read, which were damaged.
    """

    tensor: str
    mode: ModeKeys
    worker: str | None
    coverage: Coverage
    steps: list[int] = field(default_factory=list)
    global_steps: list[int | None] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)

    def last(self, statistic: str) -> float | None:
        """The last value of ``statistic`` that is not None (None when there is none)."""
        return next((v for v in reversed(self.values.get(statistic, [])) if v is not None), None)


class SeriesCache(LruCache[StepRows]):
    """Statistics of steps already read, per series: a warm request reads only new steps.

    Steps of a trial never change once complete, so a long-lived viewer (the TensorBoard plugin)
    keeps them; the least recently used series are dropped beyond ``max_series``. ``get(key)``
    returns the series' ``{step: statistics}`` (a new empty one when unknown).
    """

    def __init__(self, max_series: int = 512) -> None:
        super().__init__(dict, max_series)

    @property
    def max_series(self) -> int:
        """How many series are kept (``max_entries``)."""
        return self.max_entries

    @max_series.setter
    def max_series(self, value: int) -> None:
        self.max_entries = value


def tensor_series(
    trial: Trial,
    tensor: str,
    mode: ModeKeys = ModeKeys.GLOBAL,
    worker: str | None = None,
    max_points: int | None = None,
    names: Sequence[str] | None = None,
    cache: SeriesCache | None = None,
) -> Series:
    """The statistics of ``tensor`` over the steps of ``mode``.

    Args:
        trial: the trial.
        tensor: a tensor name of the trial.
        mode: whose steps (mode steps; GLOBAL: global steps).
        worker: whose data (default: each step's first worker).
        max_points: at most this many steps, thinned evenly (None: all).
        names: statistics wanted (see :func:`~mltrace.analysis.statistics.step_statistics`;
            None: what each step has).
        cache: keeps what was read for the next call.

    Returns:
        a Series; steps without any statistic are not in it.
    """
    t = trial.tensor(tensor)
    steps = t.steps(mode)
    shown = thin(steps, max_points)
    key = (trial.path, tensor, mode.name, worker, tuple(names) if names is not None else None)
    known = cache.get(key) if cache is not None else {}
    out = Series(tensor, mode, worker, Coverage(len(steps), len(shown)))
    rows = []
    for step in shown:
        if step not in known:
            try:
                known[step] = step_statistics(t, step, mode, worker, names)
            except UNREADABLE as exc:  # not cached: the file may be restored
                out.coverage.damaged.append(left_out(tensor, step, exc))
        if row := known.get(step):
            rows.append((step, row))
    out.steps = [s for s, _ in rows]
    out.global_steps = [trial.global_step(mode, s) for s in out.steps]
    for name in sorted({k for _, r in rows for k in r}):
        out.values[name] = [r.get(name) for _, r in rows]
    return out


def left_out(tensor: str, step: int, exc: Exception) -> Damaged:
    """Log a step that a view leaves out because its record cannot be read, and describe it."""
    logger.warning("mltrace: step %d of %s left out: %s", step, tensor, exc)
    return Damaged(step, str(exc))


def tensor_modes(trial: Trial, tensor: str) -> list[ModeKeys]:
    """Modes in which ``tensor`` has steps (GLOBAL only when the trial has no other mode)."""
    t = trial.tensor(tensor)
    return [m for m in trial.modes() if t.steps(m)] or [ModeKeys.GLOBAL]


def tensor_workers(trial: Trial, tensor: str, mode: ModeKeys) -> list[str]:
    """Workers that saved ``tensor`` in ``mode`` (looked up at its first and last steps: a worker
    that joins or leaves in between is not listed, and the index is not walked whole)."""
    t = trial.tensor(tensor)
    steps = t.steps(mode)
    found: set[str] = set()
    for step in {steps[0], steps[-1]} if steps else ():
        found.update(t.workers(step, mode))
    return sorted(found)
