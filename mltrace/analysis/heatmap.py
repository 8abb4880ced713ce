"""A model at a glance: one statistic of many tensors over the global steps, as a matrix of
step buckets (the TensorBoard tab's overview; any other view of "every layer at once").

Each row is a tensor, each column a bucket of consecutive global steps. A long run is cut down
on the server, never by sampling steps away: a bucket keeps the minimum and maximum of the
finite values of the steps it holds, and counts the NaN, +inf and -inf values apart, so one
non-finite step among 10,000 still shows. Values are read once per step and kept in a
:class:`StatisticCache`, so a live trial's next overview reads only its new steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mltrace.analysis.normalize import NONE, check_normalization, normalize_values
from mltrace.analysis.series import Damaged, left_out
from mltrace.analysis.statistic_cache import StatisticCache, StepValues, index_signature
from mltrace.analysis.statistics import UNREADABLE, step_statistics, value_statistics
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.reductions import as_numeric, compute_rows, parse_statistic
from mltrace.trials.refresh import collector_paused

if TYPE_CHECKING:
    from mltrace.trials import Trial

#: The statistics the overview offers: sizes (log colour), and the two counts of trouble.
OVERVIEW_STATISTICS = ("l2", "abs_max", "nan_count", "zero_fraction")
DEFAULT_COLUMNS = 400
#: Strides of the passes a deadline-bound heat map reads in: a coarse picture of the whole run first.
COARSE_FIRST = (64, 16, 4, 1)
#: Tensors read together in one batch (their records of a step share an events file).
GROUP = 16
#: What a batch read of stored reductions may raise; the steps are then read one by one.
_BATCH_FAILS: tuple[type[Exception], ...] = (OSError, *UNREADABLE)
MAX_COLUMNS = 2000


def check_statistic(statistic: str) -> str:
    """``statistic`` when the overview offers it, else MltraceValueError listing those it does."""
    if statistic not in OVERVIEW_STATISTICS:
        raise MltraceValueError(
            f"statistic {statistic!r} is not one the overview shows: choose from "
            f"{', '.join(OVERVIEW_STATISTICS)}")
    return statistic


def statistic_steps(
    trial: Trial,
    tensor: str,
    statistic: str,
    worker: str | None = None,
    cache: StatisticCache | None = None,
    damaged: list[Damaged] | None = None,
    only: set[int] | None = None,
) -> StepValues:
    """``statistic`` of ``tensor`` at every complete global step that has it (any mode).

    A stored reduction is read in one batch of records (no raw value read); a step that stored
    none gets it computed from its raw value. Unreadable steps are left out and appended to
    ``damaged``; they are not cached (the file may be restored).

    Args:
        only: read only these global steps now (the others stay for a later call).
    """
    return read_statistics(trial, [tensor], statistic, worker, cache, damaged, only)[0]


@dataclass
class _Plan:
    """What one tensor still needs read: steps with a stored reduction (and where), steps with
    only a raw value (and where), the rest (read one by one)."""

    tensor: str
    known: StepValues
    stored: list[tuple[int, Any]]  # (global step, Location of the stored reduction)
    rest: list[int]
    raw: list[tuple[int, Any]] = field(default_factory=list)  # (global step, raw Location)


def _plan(trial: Trial, tensor: str, statistic: str, worker: str | None,
          cache: StatisticCache | None, damaged: list[Damaged] | None,
          only: set[int] | None, fixed: str | None = None) -> _Plan:
    """What ``tensor`` still needs read (``fixed``: whose values, when that is one worker for
    every step: ``worker``, or the trial's only one; else each step's first)."""
    name, is_abs = parse_statistic(statistic)
    entries = trial.index_entries(tensor)
    known = cache.get((trial.path, tensor, statistic, worker)) if cache is not None else StepValues()
    present = entries.global_steps()
    signature = index_signature(trial, present)
    if known.signature == signature or (only is not None and not only):
        if damaged is not None:
            damaged.extend(known.damaged)
        return _Plan(tensor, known, [], [])
    have = set(known.steps.tolist())
    new = sorted(s for s in present
                 if s not in have and (only is None or s in only) and trial.is_step_complete(s))
    retried = set(new)
    known.damaged = [d for d in known.damaged if d.step not in retried]
    if damaged is not None:
        damaged.extend(known.damaged)
    if only is None:
        known.signature = signature  # every step read: next time only a changed index reads
    plan = _Plan(tensor, known, [], [])
    reductions, values, key = entries.reductions, entries.values, (name, is_abs)
    for step in new:
        by_worker = reductions.get(step)
        if by_worker:  # a reduction stored, this one or not this worker's: else one by one
            mine = by_worker.get(fixed if fixed is not None else min(by_worker))
            loc = mine.get(key) if mine else None
            if loc is None:
                plan.rest.append(step)
            else:
                plan.stored.append((step, loc))
            continue
        raw = values.get(step)
        if raw and (worker is None or worker in raw):
            plan.raw.append((step, raw[fixed if fixed is not None else min(raw)]))
        else:
            plan.rest.append(step)
    return plan


def read_statistics(
    trial: Trial,
    tensors: Sequence[str],
    statistic: str,
    worker: str | None = None,
    cache: StatisticCache | None = None,
    damaged: list[Damaged] | None = None,
    only: set[int] | None = None,
    siblings: bool = False,
) -> list[StepValues]:
    """:func:`statistic_steps` of several tensors, their stored reductions read in one batch
    (a step's events file holds every tensor of the step: a local store opens it once).

    With ``siblings`` (what the overview reads), a raw value decoded for one of the overview's
    statistics gives the others too: they are kept in ``cache`` for the steps they lack, so
    switching the statistic of a trial saved raw reads nothing again."""
    with collector_paused():  # a million small objects made, none in a cycle
        return _read_statistics(trial, tensors, statistic, worker, cache, damaged, only, siblings)


def _read_statistics(trial: Trial, tensors: Sequence[str], statistic: str, worker: str | None,
                     cache: StatisticCache | None, damaged: list[Damaged] | None,
                     only: set[int] | None, siblings: bool) -> list[StepValues]:
    if cache is not None:
        cache.restore(trial)
    workers = trial.workers_seen()  # the index as read so far, as _plan reads it: no listing
    fixed = worker if worker is not None else (workers[0] if len(workers) == 1 else None)
    plans = [_plan(trial, t, statistic, worker, cache, damaged, only, fixed) for t in tensors]
    others = ([s for s in OVERVIEW_STATISTICS if s != statistic]
              if siblings and cache is not None and statistic in OVERVIEW_STATISTICS else [])
    # per tensor, (steps, values) read of each statistic: the one asked for, then the others
    got: dict[str, dict[str, tuple[list[int], list[float]]]] = {
        p.tensor: {s: ([], []) for s in (statistic, *others)} for p in plans}
    for plan, step, arr in _read_batch(trial, plans, lambda p: p.stored):
        flat = np.asarray(arr).reshape(-1)
        got_steps, got_values = got[plan.tensor][statistic]
        got_steps.append(step)
        got_values.append(float(np.real(flat[0])) if flat.size else float("nan"))
    _raw_statistics(_read_batch(trial, plans, lambda p: p.raw), [statistic, *others], got)
    for plan in plans:
        if plan.rest:
            _read_rest(trial, plan, [statistic, *others], worker, damaged, got[plan.tensor])
        plan.known.extend(*got[plan.tensor][statistic])
        if cache is not None and any(steps for steps, _ in got[plan.tensor].values()):
            cache.note_read(trial)
        for name in others:
            if got[plan.tensor][name][0] and cache is not None:
                cache.get((trial.path, plan.tensor, name, worker)).extend(*got[plan.tensor][name])
    return [plan.known for plan in plans]


def _read_batch(trial: Trial, plans: list[_Plan],
                which: Callable[[_Plan], list[tuple[int, Any]]]) -> list[tuple[_Plan, int, Any]]:
    """The records ``which(plan)`` lists for each plan, read in one batch: ``(plan, step,
    array)``. When the batch fails, their steps join each plan's ``rest`` (read one by one, each
    with the reader's own checks) and nothing is returned."""
    batch = [(plan, step, loc) for plan in plans for step, loc in which(plan)]
    if not batch:
        return []
    try:
        arrays = trial.read_tensors([loc for _, _, loc in batch])
    except _BATCH_FAILS:
        for plan in plans:
            plan.rest = sorted(plan.rest + [step for step, _ in which(plan)])
        return []
    return [(plan, step, arr) for (plan, step, _), arr in zip(batch, arrays)]


def _raw_statistics(read: list[tuple[_Plan, int, Any]], names: list[str],
                    got: dict[str, dict[str, tuple[list[int], list[float]]]]) -> None:
    """The statistics ``names`` of raw values ``read`` (``(plan, step, array)``) into ``got``:
    a tensor's values of one shape and dtype stacked and reduced together
    (:func:`mltrace.reductions.compute_rows`, the same numbers as one by one), any other alone."""
    alike: dict[tuple[str, tuple[int, ...], str], tuple[list[int], list[np.ndarray]]] = {}
    for plan, step, arr in read:
        value = as_numeric(arr)
        if value.dtype.kind in "biufc" and value.size:
            steps, values = alike.setdefault((plan.tensor, value.shape, value.dtype.str), ([], []))
            steps.append(step)
            values.append(value)
        else:
            _keep(value_statistics(value, names), step, got[plan.tensor])
    for (tensor, _, _), (steps, values) in alike.items():
        rows = compute_rows(np.stack(values), names)
        for name in names:
            got_steps, got_values = got[tensor][name]
            got_steps.extend(steps)
            got_values.extend(np.real(rows[name]).astype(np.float64).tolist())


def _keep(row: dict[str, float] | None, step: int,
          into: dict[str, tuple[list[int], list[float]]]) -> None:
    """Append each statistic of ``into`` that ``row`` has at ``step`` to its (steps, values)."""
    for name, (got_steps, got_values) in into.items():
        if row and name in row:
            got_steps.append(step)
            got_values.append(row[name])


def _read_rest(trial: Trial, plan: _Plan, names: list[str], worker: str | None,
               damaged: list[Damaged] | None,
               into: dict[str, tuple[list[int], list[float]]]) -> None:
    """The statistics ``names`` at the steps of ``plan.rest``, one by one (each with the
    reader's own checks)."""
    t = trial.tensor(plan.tensor)
    for step in plan.rest:
        try:
            row = step_statistics(t, step, ModeKeys.GLOBAL, worker, names)
        except UNREADABLE as exc:
            plan.known.damaged.append(left_out(plan.tensor, step, exc))
            if damaged is not None:
                damaged.append(plan.known.damaged[-1])
            continue
        _keep(row, step, into)


@dataclass
class HeatmapRow:
    """One tensor's buckets: finite minimum and maximum (NaN where the bucket has no finite
    value), how many steps it holds, and its NaN, +inf and -inf values counted apart."""

    tensor: str
    low: np.ndarray
    high: np.ndarray
    count: np.ndarray
    nan: np.ndarray
    posinf: np.ndarray
    neginf: np.ndarray


@dataclass
class Heatmap:
    """``statistic`` of ``rows`` over global steps, in ``len(starts)`` buckets.

    Attributes:
        starts, ends: the first and last global step each bucket covers (inclusive).
        steps: how many distinct global steps the rows hold in all; ``bucketed``: whether
            buckets hold more than one step (the matrix is then cut down, min/max per bucket).
        damaged: steps left out because their records cannot be read.
        complete: False when a deadline stopped the reading before every step was read.
    """

    statistic: str
    mode: ModeKeys | None
    starts: list[int]
    ends: list[int]
    steps: int
    rows: list[HeatmapRow]
    damaged: list[Damaged] = field(default_factory=list)
    #: False when a deadline stopped the reading: the matrix shows the steps read so far.
    complete: bool = True

    @property
    def bucketed(self) -> bool:
        """True when some bucket holds more than one global step."""
        return self.steps > len(self.starts)


def _bucket_edges(steps: np.ndarray, columns: int) -> np.ndarray:
    """Indices into the sorted distinct ``steps`` where each of at most ``columns`` buckets
    starts: equal numbers of saved steps per bucket, so gaps in saving leave no empty column."""
    n = len(steps)
    if n <= columns:
        return np.arange(n)
    return np.unique(np.floor(np.arange(columns) * (n / columns)).astype(np.int64))


def tensor_heatmap(
    trial: Trial,
    tensors: Sequence[str],
    statistic: str = "l2",
    mode: ModeKeys | None = None,
    columns: int = DEFAULT_COLUMNS,
    worker: str | None = None,
    cache: StatisticCache | None = None,
    deadline: float | None = None,
    normalize: str = NONE,
) -> Heatmap:
    """``statistic`` of each of ``tensors`` over the global steps of ``trial``, bucketed.

    Args:
        trial: the trial (refreshed once first when live).
        tensors: the rows, in order.
        statistic: one of OVERVIEW_STATISTICS.
        mode: only the steps of this mode (None: every mode, on the global step axis).
        columns: at most this many buckets (1 to MAX_COLUMNS).
        worker: whose values (default: each step's first worker).
        cache: keeps what was read for the next call.
        deadline: a ``time.monotonic()`` after which no more steps are read: the heat map is
            then built from what was read so far (``complete`` False; call again to go on).
            Steps are read coarse first (every 64th, then 16th, 4th, all), so an early answer
            already spans the whole run.
        normalize: each row's values normalized before bucketing (one of
            ``normalize.NORMALIZATIONS``: ``row``, ``first``, ``change``; ``none`` keeps them).

    Raises:
        MltraceValueError: an unknown statistic or normalization, or a column count out of range.
    """
    check_statistic(statistic)
    check_normalization(normalize)
    if not 1 <= columns <= MAX_COLUMNS:
        raise MltraceValueError(f"columns={columns} is out of range: give 1 to {MAX_COLUMNS}")
    trial.maybe_refresh()
    damaged: list[Damaged] = []
    if cache is None:
        cache = StatisticCache()
    complete = read_coarse_first(trial, tensors, statistic, worker, cache, damaged, deadline)
    rows = read_statistics(trial, tensors, statistic, worker, cache, damaged,
                           None if complete else set(), siblings=True)
    if complete:
        cache.persist(trial)
    found = in_mode(trial, list(zip(tensors, rows)), mode)
    out = bucket_rows(found, statistic, columns, normalize)
    out.mode, out.damaged, out.complete = mode, list(dict.fromkeys(damaged)), complete
    return out


def read_coarse_first(trial: Trial, tensors: Sequence[str], statistic: str, worker: str | None,
                      cache: StatisticCache, damaged: list[Damaged],
                      deadline: float | None) -> bool:
    """Read ``statistic`` of ``tensors`` into ``cache`` until ``deadline`` (``time.monotonic()``;
    None: no limit), every 64th step first, then every 16th, 4th, all (COARSE_FIRST), so that
    what is read by the deadline spans the whole run (with the overview's other statistics:
    ``read_statistics(siblings=True)``). True when every step was read."""
    if deadline is None:
        return True
    every = trial.saved_steps(ModeKeys.GLOBAL)
    for stride in COARSE_FIRST:
        subset = set(every[::stride]) if stride > 1 else None
        todo = [t for t in tensors
                if (cache.get((trial.path, t, statistic, worker)).stride_read or stride + 1)
                > stride]
        for k in range(0, len(todo), GROUP):
            if time.monotonic() > deadline:
                return False
            for entry in read_statistics(trial, todo[k:k + GROUP], statistic, worker, cache,
                                         damaged, subset, siblings=True):
                entry.stride_read = stride
    return True


def in_mode(trial: Trial, found: list[tuple[str, StepValues]],
            mode: ModeKeys | None) -> list[tuple[str, StepValues]]:
    """``found`` with only the global steps of ``mode`` kept (all of them when None)."""
    if mode is None:
        return found
    steps = {g for g in (trial.to_global_step(s, mode) for s in trial.saved_steps(mode))
             if g is not None}
    keep = np.fromiter(sorted(steps), dtype=np.int64)
    return [(t, _only(sv, keep)) for t, sv in found]


def bucket_rows(found: Sequence[tuple[str, StepValues]], statistic: str, columns: int,
                normalize: str = NONE) -> Heatmap:
    """The heat map of values already read: ``(tensor, StepValues)`` rows bucketed over the union
    of their global steps into at most ``columns`` buckets of equal numbers of steps, each row's
    values normalized first (``normalize``; its NaN and infinities are still counted from the
    values themselves)."""
    all_steps = np.unique(np.concatenate([sv.steps for _, sv in found] or [np.empty(0, np.int64)]))
    first = _bucket_edges(all_steps, columns)
    starts = all_steps[first] if len(all_steps) else np.empty(0, np.int64)
    ends = (np.append(all_steps[first[1:] - 1], all_steps[-1]) if len(all_steps)
            else np.empty(0, np.int64))
    rows = [_row(t, sv, starts, normalize) for t, sv in found]
    return Heatmap(statistic, None, starts.tolist(), ends.tolist(), len(all_steps), rows)


def _only(sv: StepValues, steps: np.ndarray) -> StepValues:
    keep = np.isin(sv.steps, steps)
    return StepValues(sv.steps[keep], sv.values[keep])


def _row(tensor: str, sv: StepValues, starts: np.ndarray, normalize: str = NONE) -> HeatmapRow:
    """Reduce one tensor's values (normalized ``normalize``) into the buckets that begin at
    ``starts``."""
    k = len(starts)
    col = np.searchsorted(starts, sv.steps, side="right") - 1
    v = sv.values
    shown = v if normalize == NONE else normalize_values(v, normalize)
    finite = np.isfinite(shown)
    low = np.full(k, np.nan)
    high = np.full(k, np.nan)
    np.fmin.at(low, col[finite], shown[finite])
    np.fmax.at(high, col[finite], shown[finite])
    return HeatmapRow(
        tensor, low, high,
        count=np.bincount(col, minlength=k),
        nan=np.bincount(col[np.isnan(v)], minlength=k),
        posinf=np.bincount(col[np.isposinf(v)], minlength=k),
        neginf=np.bincount(col[np.isneginf(v)], minlength=k),
    )
