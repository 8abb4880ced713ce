"""What the plugin's panels show, computed from a Trial through mltrace's reader: pure functions
that return JSON-ready dicts (no HTTP here; plugin.py adds the routes).

Series are read step by step through the index, so no step is sampled away; a series is cut down
only when the caller passes ``max_points`` and the answer then says so (``downsampled``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from mltrace.exceptions import (
    CorruptRecordError,
    InvalidWorker,
    MltraceError,
    MltraceTypeError,
    TensorUnavailableForStep,
)
from mltrace.format import paths
from mltrace.modes import ModeKeys
from mltrace.reductions import compute
from mltrace.rules.results import read_results
from mltrace.trials import Trial

logger = logging.getLogger(__name__)
#: A step whose record is damaged (or of a dtype this mltrace cannot read) is left out of a chart
#: with a warning, and listed under "damaged", instead of failing the whole panel.
UNREADABLE = (CorruptRecordError, MltraceTypeError)
#: Reductions computed from raw values when a step stored none (numpy's definitions).
RAW_REDUCTIONS = ("min", "max", "mean", "std", "l1", "l2", "nan_count", "inf_count")
#: The value table shows tensors up to this many elements whole; larger ones as a marked preview.
MAX_TABLE_ELEMENTS = 10_000
PREVIEW_ELEMENTS = 1_000
DEFAULT_HISTOGRAM_BINS = 30


def reduction_key(name: str, abs_: bool) -> str:
    """The series name of a reduction: ``l2``, ``abs_max``."""
    return f"abs_{name}" if abs_ else name


def pick(items: list[Any], max_points: int | None) -> list[Any]:
    """``items`` evenly thinned to ``max_points`` (first and last kept); all when None."""
    if max_points is None or len(items) <= max_points:
        return list(items)
    if max_points < 2:
        return [items[-1]]
    idx = np.unique(np.linspace(0, len(items) - 1, max_points).round().astype(int))
    return [items[i] for i in idx]


def _as_float(value: Any) -> float:
    arr = np.asarray(getattr(value, "to_float32", lambda: value)())
    return float(arr.reshape(-1)[0]) if arr.dtype.kind in "biuf" else float("nan")


def _numeric(value: Any) -> np.ndarray:
    """A numeric numpy view of a stored value (bfloat16 as float32)."""
    to32 = getattr(value, "to_float32", None)
    return np.asarray(to32() if to32 else value)


class SeriesCache:
    """Per (trial, tensor, mode, worker): {step: {reduction: value}} of steps already read.
    Steps of a trial never change once complete, so a warm request reads only new steps."""

    def __init__(self, max_series: int = 512) -> None:
        self._data: OrderedDict[tuple, dict[int, dict[str, float] | None]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_series = max_series

    def get(self, key: tuple) -> dict[int, dict[str, float] | None]:
        with self._lock:
            series = self._data.get(key)
            if series is None:
                series = self._data[key] = {}
                while len(self._data) > self.max_series:
                    self._data.popitem(last=False)
            else:
                self._data.move_to_end(key)
            return series


def step_values(trial: Trial, tensor: str, step: int, mode: ModeKeys, worker: str | None) -> dict[str, float] | None:
    """The reductions of ``tensor`` at one step: the stored ones, else computed from the raw value
    (``value`` alone for a one-element tensor); None when the step (or worker) has neither."""
    t = trial.tensor(tensor)
    try:
        stored = t.reduction_values(step, mode, worker)
    except InvalidWorker:
        stored = {}
    out = {reduction_key(n, a): _as_float(v) for (n, a), v in stored.items()}
    if out:
        return out  # the raw value (if saved too) is read only for tables and histograms
    try:
        value = _numeric(t.value(step, mode, worker))
    except (TensorUnavailableForStep, InvalidWorker):
        return out or None
    if value.size == 1 and value.dtype.kind in "biuf":
        out["value"] = float(value.reshape(-1)[0])  # a loss or metric: its reductions are itself
    elif not stored:
        out.update(raw_reductions(value))
    return out


def raw_reductions(value: np.ndarray) -> dict[str, float]:
    """RAW_REDUCTIONS of a raw value, by mltrace.reductions' definitions (float64 for ints and
    bools, float32 for float16), in one pass of numpy calls: ``compute`` per reduction costs
    more than the reading on long series of small tensors."""
    arr = value.reshape(-1)
    if arr.size == 0 or arr.dtype.kind not in "biufc":
        return {}
    if arr.dtype.kind == "c":
        return {n: float(np.real(compute(n, arr))) for n in RAW_REDUCTIONS if compute(n, arr) is not None}
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)
    elif arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    with np.errstate(all="ignore"):
        mean = arr.mean()
        absolute = np.abs(arr)
        return {"min": float(arr.min()), "max": float(arr.max()), "mean": float(mean), "std": float(arr.std()),
                "l1": float(absolute.sum()), "l2": float(np.sqrt(np.square(absolute).sum())),
                "nan_count": float(np.count_nonzero(np.isnan(arr))), "inf_count": float(np.count_nonzero(np.isinf(arr)))}


def mode_series(trial: Trial, tensor: str, mode: ModeKeys, worker: str | None, cache: SeriesCache,
                max_points: int | None) -> dict[str, Any]:
    """One mode's series of one tensor: its mode steps, their global steps (the x axis shared by
    all modes, as in the TensorBoard export), and each reduction's values aligned with them."""
    steps = trial.tensor(tensor).steps(mode)
    shown = pick(steps, max_points)
    known = cache.get((trial.path, tensor, mode.name, worker))
    rows = []
    damaged: list[dict[str, Any]] = []
    for step in shown:
        if step not in known:
            try:
                known[step] = step_values(trial, tensor, step, mode, worker)
            except UNREADABLE as exc:  # not cached: the file may be restored
                _left_out(tensor, step, exc, damaged)
        rows.append(known.get(step))
    kept = [(s, r) for s, r in zip(shown, rows) if r]
    names = sorted({k for _, r in kept for k in r})
    out: dict[str, Any] = {
        "steps": [s for s, _ in kept],
        "global_steps": [trial.global_step(mode, s) for s, _ in kept],
        "values": {n: [r.get(n) for _, r in kept] for n in names},
    }
    if len(shown) < len(steps):
        out["downsampled"] = {"total": len(steps), "returned": len(shown)}
    if damaged:
        out["damaged"] = damaged
    return out


def _left_out(tensor: str, step: int, exc: Exception, damaged: list[dict[str, Any]]) -> None:
    """Log and list a step that a chart leaves out because its record cannot be read."""
    logger.warning("mltrace: step %d of %s left out: %s", step, tensor, exc)
    damaged.append({"step": step, "error": str(exc)})


def tensor_modes(trial: Trial, tensor: str) -> list[ModeKeys]:
    """Modes in which ``tensor`` has steps (GLOBAL only when the trial has no other mode)."""
    t = trial.tensor(tensor)
    modes = [m for m in trial.modes() if t.steps(m)]
    return modes or [ModeKeys.GLOBAL]


def tensor_workers(trial: Trial, tensor: str, mode: ModeKeys) -> list[str]:
    """Workers that saved ``tensor`` in ``mode`` (looked up at its first and last steps)."""
    t = trial.tensor(tensor)
    steps = t.steps(mode)
    found: set[str] = set()
    for step in {steps[0], steps[-1]} if steps else ():
        found.update(t.workers(step, mode))
    return sorted(found)


def series(trial: Trial, tensor: str, modes: list[ModeKeys] | None, worker: str | None, per_worker: bool,
           cache: SeriesCache, max_points: int | None) -> dict[str, Any]:
    """The Tensors panel's chart data for one run: per mode, and per worker when asked."""
    out: dict[str, Any] = {"run": trial.name, "modes": {}}
    for mode in modes or tensor_modes(trial, tensor):
        if not trial.tensor(tensor).steps(mode):
            continue
        entry = mode_series(trial, tensor, mode, worker, cache, max_points)
        if per_worker:
            entry["workers"] = {w: mode_series(trial, tensor, mode, w, cache, max_points)
                                for w in tensor_workers(trial, tensor, mode)}
        out["modes"][mode.name] = entry
    return out


def histogram_of(value: np.ndarray, bins: int) -> list[list[float]] | None:
    """[[left, right, count], ...] over the finite values, equal-width buckets (TensorBoard's
    form); None when there is no finite value."""
    arr = _numeric(value).reshape(-1)
    if arr.dtype.kind not in "biuf":
        return None
    arr = arr.astype(np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    lo, hi = float(arr.min()), float(arr.max())
    if lo == hi:
        return [[lo, hi, float(arr.size)]]
    counts, edges = np.histogram(arr, bins=bins, range=(lo, hi))
    return [[float(edges[i]), float(edges[i + 1]), float(c)] for i, c in enumerate(counts)]


def histograms(trial: Trial, tensor: str, mode: ModeKeys, worker: str | None, bins: int,
               max_steps: int | None) -> dict[str, Any]:
    """Histograms over steps from the raw values (only steps that saved the raw tensor)."""
    t = trial.tensor(tensor)
    raw = t.value_steps(mode, worker)
    shown = pick(raw, max_steps)
    out: dict[str, Any] = {"run": trial.name, "mode": mode.name, "steps": [], "histograms": []}
    if not raw:
        out["unavailable"] = ("only reductions of this tensor were saved: save the raw tensor "
                              "(ReductionConfig(save_raw_tensor=True)) to see histograms")
        return out
    damaged: list[dict[str, Any]] = []
    for step in shown:
        try:
            h = histogram_of(t.value(step, mode, worker), bins)
        except UNREADABLE as exc:
            _left_out(tensor, step, exc, damaged)
            continue
        if h is not None:
            out["steps"].append(step)
            out["histograms"].append(h)
    if len(shown) < len(raw):
        out["downsampled"] = {"total": len(raw), "returned": len(shown)}
    if damaged:
        out["damaged"] = damaged
    return out


def value_table(trial: Trial, tensor: str, step: int, mode: ModeKeys, worker: str | None) -> dict[str, Any]:
    """The raw value of ``tensor`` at ``step``: whole when small, else a marked preview."""
    value = trial.tensor(tensor).value(step, mode, worker)
    arr = _numeric(value)
    out: dict[str, Any] = {"run": trial.name, "tensor": tensor, "step": step, "mode": mode.name,
                           "shape": list(arr.shape), "dtype": getattr(value, "dtype", arr.dtype).name,
                           "size": int(arr.size)}
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
    decode = np.vectorize(lambda x: x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x), otypes=[object])
    return decode(arr).tolist() if arr.ndim else decode(arr).item()


def run_summary(trial: Trial) -> dict[str, Any]:
    """Modes, steps, workers and tensors of a trial, and its tensors by collection."""
    modes = {}
    for mode in trial.modes():
        steps = trial.steps(mode)
        modes[mode.name] = {"steps": len(steps), "first": steps[0] if steps else None,
                            "last": steps[-1] if steps else None}
    names = trial.tensor_names()
    by_collection = {name: trial.tensor_names(collection=coll) for name, coll in sorted(trial.collections().items())}
    return {"run": trial.name, "location": trial.path, "modes": modes, "workers": trial.workers(),
            "ended": trial.loaded_all_steps, "tensors": names,
            "collections": {k: v for k, v in by_collection.items() if v}}


def collections(trial: Trial) -> dict[str, Any]:
    """The Collections panel: each collection, its regexes, configs and tensors."""
    out = []
    for name, coll in sorted(trial.collections().items()):
        reduction = coll.effective_reduction_config()
        out.append({
            "name": name,
            "include_regex": list(coll.include_regex),
            "save_config": coll.effective_save_config().to_json_dict(),
            "reduction_config": {**reduction.to_json_dict(), "mltrace_reductions": reduction.extra_reductions_string()},
            "save_histogram": bool(coll.save_histogram),
            "tensors": trial.tensor_names(collection=coll),
        })
    return {"run": trial.name, "collections": out}


def mlflow_link(base: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """The MLflow UI page of a run, when the base URL is http(s) and the ids are known."""
    if not base or not run_id or not experiment_id or not base.startswith(("http://", "https://")):
        return None
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def trial_tracking_uri(trial: Trial) -> str | None:
    """The tracking URI the training hook recorded in the trial (mltrace_mlflow_run.json)."""
    try:
        if not trial.storage.exists(paths.MLFLOW_RUN_FILE):
            return None
        return json.loads(trial.storage.read(paths.MLFLOW_RUN_FILE)).get("tracking_uri")
    except (OSError, ValueError, AttributeError, MltraceError):
        return None


def rules(trial: Trial, mlflow_uri: str | None) -> dict[str, Any]:
    """The Rules panel: each rule execution on the trial, newest first."""
    base = mlflow_uri or trial_tracking_uri(trial)
    out = []
    for result in reversed(read_results(trial.storage)):
        out.append({
            "rule": result.rule, "status": result.status, "parameters": result.parameters,
            "fired_steps": result.fired_steps, "first_step": result.first_step,
            "evaluated_steps": result.evaluated_steps, "message": result.message, "error": result.error,
            "started": result.started, "ended": result.ended,
            "mlflow_run_id": result.mlflow_run_id, "mlflow_experiment_id": result.mlflow_experiment_id,
            "mlflow_url": mlflow_link(base, result.mlflow_experiment_id, result.mlflow_run_id),
        })
    return {"run": trial.name, "rules": out}
