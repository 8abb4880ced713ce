"""What the plugin's panels show: pure functions that put what ``mltrace.analysis`` computes
from a Trial into JSON-ready dicts (no HTTP here; plugin.py adds the routes).

Series are read step by step through the index, so no step is sampled away; a series is cut down
only when the caller passes ``max_points`` and the answer then says so (``downsampled``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mltrace import analysis
from mltrace.modes import ModeKeys
from mltrace.reductions import as_numeric
from mltrace.trials import Trial

#: Statistics computed from raw values when a step stored no reduction (mltrace.reductions').
RAW_REDUCTIONS = analysis.RAW_STATISTICS
#: The value table shows tensors up to this many elements whole; larger ones as a marked preview.
MAX_TABLE_ELEMENTS = 10_000
PREVIEW_ELEMENTS = 1_000
DEFAULT_HISTOGRAM_BINS = 30
#: What the plugin keeps of series already read (a class of mltrace.analysis).
SeriesCache = analysis.SeriesCache


def raw_reductions(value: np.ndarray) -> dict[str, float]:
    """RAW_REDUCTIONS of a raw value, by mltrace.reductions' definitions."""
    return analysis.value_statistics(value, RAW_REDUCTIONS)


def _coverage(coverage: analysis.Coverage) -> dict[str, Any]:
    """The JSON keys that say what a chart left out: steps thinned away, damaged steps."""
    out: dict[str, Any] = {}
    if coverage.thinned:
        out["downsampled"] = {"total": coverage.total, "returned": coverage.read}
    if coverage.damaged:
        out["damaged"] = [{"step": d.step, "error": d.error} for d in coverage.damaged]
    return out


def mode_series(trial: Trial, tensor: str, mode: ModeKeys, worker: str | None, cache: SeriesCache,
                max_points: int | None) -> dict[str, Any]:
    """One mode's series of one tensor: its mode steps, their global steps (the x axis shared by
    all modes, as in the TensorBoard export), and each statistic's values aligned with them."""
    found = analysis.tensor_series(trial, tensor, mode, worker, max_points, cache=cache)
    return {"steps": found.steps, "global_steps": found.global_steps, "values": found.values,
            **_coverage(found.coverage)}


def series(
    trial: Trial,
    tensor: str,
    modes: list[ModeKeys] | None,
    worker: str | None,
    per_worker: bool,
    cache: SeriesCache,
    max_points: int | None,
) -> dict[str, Any]:
    """The Tensors panel's chart data for one run: per mode, and per worker when asked."""
    out: dict[str, Any] = {"run": trial.name, "modes": {}}
    for mode in modes or analysis.tensor_modes(trial, tensor):
        if not trial.tensor(tensor).steps(mode):
            continue
        entry = mode_series(trial, tensor, mode, worker, cache, max_points)
        if per_worker:
            entry["workers"] = {
                w: mode_series(trial, tensor, mode, w, cache, max_points)
                for w in analysis.tensor_workers(trial, tensor, mode)
            }
        out["modes"][mode.name] = entry
    return out


def histograms(
    trial: Trial, tensor: str, mode: ModeKeys, worker: str | None, bins: int, max_steps: int | None
) -> dict[str, Any]:
    """Histograms over steps from the raw values (only steps that saved the raw tensor)."""
    found = analysis.tensor_histograms(trial, tensor, mode, worker, bins, max_steps)
    out: dict[str, Any] = {
        "run": trial.name,
        "mode": mode.name,
        "worker": worker,
        "steps": found.steps,
        "global_steps": [trial.global_step(mode, s) for s in found.steps],
        "step_modes": [_mode_label(trial, trial.global_step(mode, s)) for s in found.steps],
        "histograms": [h.buckets() for h in found.histograms],
    }
    if not found.coverage.total:
        out["unavailable"] = (
            "only reductions of this tensor were saved: save the raw tensor "
            "(ReductionConfig(save_raw_tensor=True)) to see histograms"
        )
        return out
    return {**out, **_coverage(found.coverage)}


def _mode_label(trial: Trial, global_step: int | None) -> str | None:
    """``"EVAL 10"``: the mode and mode step of a global step (None when unknown)."""
    if global_step is None:
        return None
    mode, mode_step = trial.mode_modestep(global_step)
    return f"{mode.name} {mode_step}" if mode is not None else None


def value_table(
    trial: Trial, tensor: str, step: int, mode: ModeKeys, worker: str | None
) -> dict[str, Any]:
    """The raw value of ``tensor`` at ``step``: whole when small, else a marked preview."""
    value = trial.tensor(tensor).value(step, mode, worker)
    arr = as_numeric(value)
    out: dict[str, Any] = {
        "run": trial.name,
        "tensor": tensor,
        "step": step,
        "mode": mode.name,
        "global_step": trial.global_step(mode, step),
        "shape": list(arr.shape),
        "dtype": getattr(value, "dtype", arr.dtype).name,
        "size": int(arr.size),
    }
    if arr.size > MAX_TABLE_ELEMENTS:
        out["truncated"] = True
        out["preview"] = _jsonable(arr.reshape(-1)[:PREVIEW_ELEMENTS])
    else:
        out["truncated"] = False
        out["values"] = _jsonable(arr)
    return out


def _jsonable(arr: np.ndarray) -> Any:
    if arr.dtype.kind in "biuf":
        return arr.tolist()
    if arr.dtype.kind == "c":
        return np.vectorize(str, otypes=[object])(arr).tolist() if arr.ndim else str(arr.item())
    decode = np.vectorize(
        lambda x: x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x), otypes=[object]
    )
    return decode(arr).tolist() if arr.ndim else decode(arr).item()


def run_summary(trial: Trial) -> dict[str, Any]:
    """Modes, steps, workers and tensors of a trial, and its tensors by collection."""
    info = analysis.trial_overview(trial)
    return {
        "run": info.name,
        "location": info.location,
        "modes": {name: span.to_dict() for name, span in info.modes.items()},
        "workers": info.workers,
        "ended": info.ended,
        "tensors": info.tensors,
        "collections": {k: v for k, v in info.members.items() if v},
    }


def collections(trial: Trial) -> dict[str, Any]:
    """The Collections panel: each collection, its regexes, configs and tensors."""
    out = []
    for name, coll in sorted(trial.collections().items()):
        reduction = coll.effective_reduction_config()
        out.append(
            {
                "name": name,
                "include_regex": list(coll.include_regex),
                "save_config": coll.effective_save_config().to_json_dict(),
                "reduction_config": {
                    **reduction.to_json_dict(),
                    "mltrace_reductions": reduction.extra_reductions_string(),
                },
                "save_histogram": bool(coll.save_histogram),
                "tensors": trial.tensor_names(collection=coll),
            }
        )
    return {"run": trial.name, "collections": out}
