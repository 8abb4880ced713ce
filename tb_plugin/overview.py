"""The overview panel's data: every tensor of a collection as a row, buckets of global steps as
columns, one statistic per cell (``mltrace.analysis.tensor_heatmap`` computes it), with the rule
findings to mark on it. JSON-ready dicts; no HTTP here.

A cell is ``low``/``high`` (finite minimum and maximum of the bucket, null when it has none),
``count`` (saved steps in it); non-finite values are listed apart per row as
``[column, nan, +inf, -inf]`` so that none is ever lost to a bucket.

Rows come in model order (``mltrace.analysis.order.model_order``: the order the model ran its
layers), in sections of one kind each (``kind``: gradients, weights, ...; the tab gives each its
own colour scale), each row with its layer (``group``: ``h.0``, ``Sequential_3``) for the tab to
group rows by. ``normalize`` turns values into ratios that show change (per row, relative to
the first step, step to step: ``mltrace.analysis.normalize``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mltrace import analysis
from mltrace.analysis import heatmap, layers, normalize, order
from mltrace.analysis.difference import difference_heatmap
from mltrace.exceptions import MltraceValueError
from mltrace.format.json_safe import json_safe
from mltrace.modes import ModeKeys
from mltrace.trials import Trial

from . import rules_view

#: The collection the overview opens on when the trial has it (what goes wrong first in training).
DEFAULT_COLLECTION = "gradients"
#: ``collection=*``: every tensor of the trial (an empty parameter means "the default").
ALL = "*"
#: Seconds one answer spends reading steps not read before; the rest comes with the next asks
#: (the answer says ``complete`` false and the tab asks again), so a first look at a long run
#: is quick and fills in, coarse first.
READ_BUDGET_S = 1.0


def default_collection(members: dict[str, list[str]]) -> str:
    """``gradients`` when it has tensors, else the largest collection ("" when none has any)."""
    if members.get(DEFAULT_COLLECTION):
        return DEFAULT_COLLECTION
    filled = [(len(v), k) for k, v in members.items() if v and k != "default"]
    return max(filled)[1] if filled else ""


def name_filter(pattern: str) -> re.Pattern[str]:
    """The tensor-name filter of the tab: a regular expression (searched anywhere in the name,
    case-insensitive), or, when ``pattern`` is not a valid one, the text itself (``[0`` finds
    ``layer[0]``). The frontend's filterNames does the same in the browser."""
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error:
        return re.compile(re.escape(pattern), re.IGNORECASE)


def _floats(arr: np.ndarray) -> list[float | None]:
    """Floats rounded to 5 significant digits (the colour needs no more; the JSON stays small),
    None for NaN (an empty bucket). Vectorised: n / 10**k is the double nearest that decimal, so
    it prints short."""
    x = np.asarray(arr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        digits = 4 - np.floor(np.log10(np.abs(x)))
        digits = np.where(np.isfinite(digits), np.clip(digits, -300, 300), 0)
        scale = 10.0 ** digits
        rounded = np.where(np.abs(digits) <= 22, np.round(x * scale) / scale, x)
    cells = rounded.astype(object)
    cells[np.isnan(x)] = None
    out: list[float | None] = cells.tolist()
    return out


def _row(row: heatmap.HeatmapRow, kind: str) -> dict[str, Any]:
    bad = np.flatnonzero(row.nan + row.posinf + row.neginf)
    return {
        "tensor": row.tensor,
        "kind": kind,
        "group": layers.layer_of(row.tensor),
        "low": _floats(row.low),
        "high": _floats(row.high),
        "count": row.count.tolist(),
        "nonfinite": [[int(c), int(row.nan[c]), int(row.posinf[c]), int(row.neginf[c])]
                      for c in bad],
    }


def _step_labels(trial: Trial, steps: list[int]) -> list[str | None]:
    """``"TRAIN 10"`` for each global step (None when its mode is not known)."""
    out: list[str | None] = []
    for step in steps:
        mode, mode_step = trial.mode_modestep(step)
        out.append(f"{mode.name} {mode_step}" if mode is not None else None)
    return out


def row_kinds(info: analysis.TrialOverview, collection: str, names: list[str]) -> dict[str, str]:
    """The kind of each row (its section, on a colour scale of its own): the collection's name
    when one collection of one kind is shown, else each tensor's (``layers.kind_of``), so that
    weights and gradients never share a scale."""
    if collection and collection not in layers.GENERIC:
        return {n: collection for n in names}
    return {n: layers.kind_of(n, info.collections_of(n)) for n in names}


def ordered_rows(trial: Trial, kinds: dict[str, str]) -> list[str]:
    """The rows (the keys of ``kinds``) in sections by kind (``layers.kind_rank``), each in
    model order (ordered apart: each kind's records are a stream of their own)."""
    sections: dict[str, list[str]] = {}
    for name, kind in kinds.items():
        sections.setdefault(kind, []).append(name)
    return [name for kind in sorted(sections, key=layers.kind_rank)
            for name in order.model_order(trial, sections[kind])]


@dataclass
class _Rows:
    """What an overview shows: the collection, its rows in order and their kinds."""

    collection: str
    names: list[str]
    kinds: dict[str, str]
    total: int  # tensors in the collection before the filter


def _rows(trial: Trial, info: analysis.TrialOverview, collection: str | None,
          pattern: str | None) -> _Rows:
    if collection == ALL:
        collection = ""
    if collection is None:
        collection = default_collection(info.members)
    if collection and collection not in info.members:
        raise MltraceValueError(
            f"trial {trial.name!r} has no collection {collection!r}; it has "
            f"{', '.join(sorted(info.members))}")
    names = info.members[collection] if collection else info.tensors
    total = len(names)
    if pattern:
        rx = name_filter(pattern)
        names = [n for n in names if rx.search(n)]
    kinds = row_kinds(info, collection, names)
    return _Rows(collection, ordered_rows(trial, kinds), kinds, total)


def _answer(trial: Trial, info: analysis.TrialOverview, shown: _Rows,
            found: heatmap.Heatmap) -> dict[str, Any]:
    """The JSON of a heat map (see the module docstring), what overview and difference share."""
    out: dict[str, Any] = {
        "run": trial.name,
        "collection": shown.collection,
        "collections": sorted(k for k, v in info.members.items() if v),
        "statistic": found.statistic,
        "statistics": list(heatmap.OVERVIEW_STATISTICS),
        "normalizations": list(normalize.NORMALIZATIONS),
        "kinds": list(dict.fromkeys(shown.kinds[n] for n in shown.names)),
        "mode": found.mode.name if found.mode is not None else None,
        "workers": info.workers,
        "ended": info.ended,
        "tensors_in_collection": shown.total,
        "starts": found.starts,
        "ends": found.ends,
        "start_modes": _step_labels(trial, found.starts),
        "steps": found.steps,
        "bucketed": found.bucketed,
        "complete": found.complete,
        "trial_steps": len(trial.saved_steps()),
        "rows": [_row(r, shown.kinds[r.tensor]) for r in found.rows],
        "findings": rules_view.findings(trial, shown.names),
    }
    if found.damaged:
        out["damaged"] = [{"step": d.step, "error": d.error} for d in found.damaged[:50]]
    return out


def overview(
    trial: Trial,
    collection: str | None,
    statistic: str,
    mode: ModeKeys | None,
    columns: int,
    pattern: str | None,
    cache: heatmap.StatisticCache,
    budget_s: float | None = READ_BUDGET_S,
    worker: str | None = None,
    how: str = normalize.NONE,
) -> dict[str, Any]:
    """The overview of one trial (see the module docstring).

    Args:
        collection: whose tensors are rows (None: :func:`default_collection`; "" or ``*``: all
            tensors).
        statistic: one of ``heatmap.OVERVIEW_STATISTICS``.
        mode: only this mode's steps (None: all, on the global step axis).
        columns: at most this many step buckets.
        pattern: keep only tensors whose names match (see :func:`name_filter`).
        budget_s: seconds spent reading new steps (None: read them all before answering).
        worker: whose values (None: each step's first worker).
        how: the normalization of each row (one of ``normalize.NORMALIZATIONS``).

    Raises:
        MltraceValueError: an unknown collection, statistic, worker or normalization.
    """
    info = analysis.trial_overview(trial)
    shown = _rows(trial, info, collection, pattern)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    if worker is not None and worker not in info.workers:
        raise MltraceValueError(
            f"trial {trial.name!r} has no worker {worker!r}; it has {', '.join(info.workers)}")
    normalize.check_normalization(how)
    found = heatmap.tensor_heatmap(trial, shown.names, statistic, mode, columns, worker,
                                   cache=cache, deadline=deadline, normalize=how)
    return {**_answer(trial, info, shown, found), "normalize": how, "worker": worker}


def difference(
    trial: Trial,
    reference: Trial,
    collection: str | None,
    statistic: str,
    mode: ModeKeys | None,
    columns: int,
    pattern: str | None,
    cache: heatmap.StatisticCache,
    budget_s: float | None = READ_BUDGET_S,
) -> dict[str, Any]:
    """Run against run: the overview of ``trial`` whose cells are the ratio of its statistic to
    ``reference``'s at the same step (``mltrace.analysis.difference``), over the tensors both
    hold, with ``parting``: where the two runs part ways (``{"step", "tensor", "value",
    "reference_value", "ratio", "others"}``; null when they agree, or while ``complete`` is
    false). ``normalize`` is ``"ratio"``; first workers.

    Raises:
        MltraceValueError: an unknown collection or statistic.
    """
    info = analysis.trial_overview(trial)
    shown = _rows(trial, info, collection, pattern)
    theirs = set(analysis.trial_overview(reference).tensors)
    kept = [n for n in shown.names if n in theirs]
    shown = _Rows(shown.collection, kept, shown.kinds, shown.total)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    found = difference_heatmap(trial, reference, kept, statistic, mode, columns, cache,
                               deadline)
    parting = found.parting
    return {
        **_answer(trial, info, shown, found.heatmap),
        "normalize": "ratio", "worker": None, "against": reference.name,
        "parting": None if parting is None else {
            "step": parting.step, "tensor": parting.panel, "value": json_safe(parting.value_b),
            "reference_value": json_safe(parting.value_a), "ratio": json_safe(parting.ratio),
            "others": parting.others[:20]},
    }
