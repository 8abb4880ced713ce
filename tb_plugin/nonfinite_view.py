"""The Rules panel's "Non-finite values": each tensor of the trial that held a NaN or an
infinity, with the first global step it did, found with no rule run.

Cheap: one statistic per tensor and step, a stored reduction where the trial has one (read in
batches of records, no raw value read) and else ``abs_max`` of the raw value. Every standard
reduction of a tensor that holds a NaN or an infinity is itself NaN or infinite, so one is
enough; ``max`` with ``abs`` comes first (it never overflows), norms and sums after. Values read
go into the plugin's StatisticCache, which the overview shares, so a later look reads only new
steps; what each tensor came to is kept apart, a few numbers per tensor (:data:`SUMMARIES`), so a
trial with more tensors than that cache holds is still read once. Within a time budget the answer
covers the tensors read so far (``complete`` False: ask again); the flight recorder's first
non-finite tensor is added where the scan did not see it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mltrace.analysis import heatmap
from mltrace.analysis.cache import LruCache
from mltrace.format.flight_record import earliest_first_nonfinite
from mltrace.reductions import statistic_name
from mltrace.trials import Trial

#: Seconds one answer spends reading; the frontend asks again while ``complete`` is False.
READ_BUDGET_S = 2.0
#: Stored reductions that show a non-finite value, best first (``abs max`` cannot overflow).
PROBES = (("max", True), ("max", False), ("min", False), ("min", True), ("mean", False),
          ("mean", True), ("l2", False), ("l1", False), ("sum", False), ("std", False),
          ("variance", False), ("median", False))
#: What a tensor without a stored reduction is read with (from its raw value).
RAW_PROBE = "abs_max"


@dataclass
class Summary:
    """What one tensor's statistic (of one worker) came to, as of the trial's index ``signature``:
    its first non-finite step and value (None: all finite), how many steps, the last one."""

    signature: tuple[int, int, int, bool, int] | None = None
    first: tuple[int, float] | None = None
    steps: int = 0
    last: int | None = None


#: Per (trial path, tensor, worker, statistic), for the life of the process; a few numbers each.
SUMMARIES: LruCache[Summary] = LruCache(Summary, max_entries=1 << 18)


def probe(trial: Trial, tensor: str) -> str:
    """The statistic that shows whether ``tensor`` was finite: a stored reduction of PROBES
    (as the trial's first step with reductions of it has), else RAW_PROBE."""
    for by_worker in trial.index_entries(tensor).reductions.values():
        stored = {key for found in by_worker.values() for key in found}
        for name, is_abs in PROBES:
            if (name, is_abs) in stored:
                return statistic_name(name, is_abs)
        break
    return RAW_PROBE


def _signature(trial: Trial, tensor: str) -> tuple[int, int, int, bool, int]:
    """What the index holds of ``tensor`` (sizes, not contents: O(1)), and how far the trial is
    complete: the same signature, nothing new to read."""
    e = trial.index_entries(tensor)
    return (len(e.values), len(e.reductions), len(e.shapes), trial.loaded_all_steps,
            trial.last_complete_step)


def _summarize(values: heatmap.StepValues, signature: tuple[int, int, int, bool, int],
               summary: Summary) -> None:
    bad = np.flatnonzero(~np.isfinite(values.values))
    summary.signature = signature
    summary.first = ((int(values.steps[bad[0]]), float(values.values[bad[0]])) if bad.size
                     else None)
    summary.steps = int(bad.size)
    summary.last = int(values.steps[bad[-1]]) if bad.size else None


def _kind(value: float) -> str:
    return "NaN" if np.isnan(value) else ("inf" if value > 0 else "-inf")


_Scanned = list[tuple[str, str | None, Summary]]


def _scan(trial: Trial, statistic: str, names: list[str], workers: list[str | None],
          cache: heatmap.StatisticCache, deadline: float | None,
          read: list[int]) -> tuple[_Scanned, bool]:
    """Each of ``names`` per worker with its summary, read where the index changed since; False
    (with what was read) once ``deadline`` passed, after at least one read of this answer
    (``read`` counts them), so that every answer gets further however small its budget."""
    out: _Scanned = []
    for k in range(0, len(names), heatmap.GROUP):
        if deadline is not None and read[0] and time.monotonic() > deadline:
            return out, False
        part = names[k:k + heatmap.GROUP]
        for worker in workers:
            entries = [(t, _signature(trial, t), SUMMARIES.get((trial.path, t, worker, statistic)))
                       for t in part]
            stale = [(t, sig, s) for t, sig, s in entries if s.signature != sig]
            if stale:
                read[0] += 1
                rows = heatmap.read_statistics(trial, [t for t, _, _ in stale], statistic, worker,
                                               cache)
                for (_, sig, summary), values in zip(stale, rows):
                    _summarize(values, sig, summary)
            out += [(t, worker, s) for t, _, s in entries]
    return out, True


def nonfinite(trial: Trial, cache: heatmap.StatisticCache | None = None,
              budget_s: float | None = None) -> dict[str, Any]:
    """The non-finite values of ``trial`` (see the module docstring).

    Args:
        trial: the trial (refreshed first when live).
        cache: values already read (the plugin's, shared with the overview); None: a new one.
        budget_s: seconds spent reading (None: read every tensor before answering).

    Returns:
        ``tensors``: one entry per tensor that held a NaN or an infinity, earliest first: its
        ``step`` (global), ``mode`` and ``mode_step``, ``worker`` (None: each step's first),
        ``kind`` (``NaN``, ``inf``, ``-inf``: the value of ``statistic`` there), ``steps`` (how
        many steps were not finite), ``last_step`` and ``source`` (``trial``, or ``flight
        recorder``); ``checked`` and ``total`` tensors; ``complete``.
    """
    trial.maybe_refresh()
    cache = cache if cache is not None else heatmap.StatisticCache()
    deadline = None if budget_s is None else time.monotonic() + budget_s
    names = trial.tensor_names()
    workers: list[str | None] = list(trial.workers()) if len(trial.workers()) > 1 else [None]
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(probe(trial, name), []).append(name)
    found: dict[str, dict[str, Any]] = {}
    checked: set[str] = set()
    complete, read = True, [0]
    for statistic, group in groups.items():
        scanned, complete = _scan(trial, statistic, group, workers, cache, deadline, read)
        for tensor, worker, summary in scanned:
            checked.add(tensor)
            _keep(found, tensor, worker, statistic, summary)
        if not complete:
            break
    if complete:
        cache.persist(trial)
    _add_recorded(trial, found)
    out = sorted(found.values(), key=lambda f: (f["step"], f["tensor"]))
    for entry in out:
        mode, mode_step = trial.mode_modestep(entry["step"])
        entry["mode"] = mode.name if mode is not None else None
        entry["mode_step"] = mode_step
    return {"tensors": out, "checked": len(checked), "total": len(names), "complete": complete}


def _keep(found: dict[str, dict[str, Any]], tensor: str, worker: str | None, statistic: str,
          summary: Summary) -> None:
    """Keep ``tensor``'s earliest non-finite step over the workers read."""
    if summary.first is None:
        return
    step, value = summary.first
    seen = found.get(tensor)
    if seen is not None and seen["step"] <= step:
        seen["steps"] = max(seen["steps"], summary.steps)
        return
    found[tensor] = {"tensor": tensor, "step": step, "worker": worker, "kind": _kind(value),
                     "statistic": statistic, "steps": summary.steps, "last_step": summary.last,
                     "source": "trial"}


def _add_recorded(trial: Trial, found: dict[str, dict[str, Any]]) -> None:
    """The flight recorder's first non-finite tensors, where the scan saw none of them there
    (a recorded tensor the trial did not save, or not yet read)."""
    first = earliest_first_nonfinite(trial.flight_records())
    if first is None:
        return
    for tensor in dict.fromkeys([first.tensor, *first.nonfinite_tensors]):
        seen = found.get(tensor)
        if seen is None or seen["step"] > first.step:
            found[tensor] = {"tensor": tensor, "step": first.step, "worker": first.worker,
                             "kind": None, "statistic": None, "steps": 1,
                             "last_step": first.step, "source": "flight recorder"}


__all__ = ["READ_BUDGET_S", "PROBES", "RAW_PROBE", "SUMMARIES", "Summary", "probe", "nonfinite"]
