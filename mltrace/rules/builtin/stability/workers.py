"""WorkerDivergence: one worker of a distributed run whose loss or gradient norm leaves the
others'."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin._params import as_bool, as_float
from mltrace.rules.builtin.stability._signals import (
    SignalNames,
    StabilityRule,
    check_min_history,
    fmt,
    grad_norm_names,
    int_param,
    step_mode,
)
from mltrace.rules.builtin.stability.loss_spike import loss_tensors, mode_label
from mltrace.stability.signals import GRAD_NORMS
from mltrace.stability.windows import robust_z, stack
from mltrace.trials import Trial


@dataclass(frozen=True)
class _Spread:
    """One tensor's values at one step across workers: the median, and per worker its value
    and relative deviation from the median."""

    median: float
    values: dict[str, float]
    deviations: dict[str, float]


class WorkerDivergence(StabilityRule):
    """Fires when one worker of a distributed run diverges from the others: at a step, its loss
    (or its model's global gradient norm, ``grad_norm/<model>``, when saved) differs from the
    median over the workers by more than ``rel_threshold`` of the median, and that relative
    deviation is also unusual for this worker: its robust z-score (median and MAD) against the
    worker's own deviations over the trailing ``window`` steps is above ``z_threshold``. A worker
    whose loss is not finite while the median is fires too. The second test keeps quiet on a
    worker that always differs (a data shard with a different loss level); the first on the
    ordinary jitter between workers.

    A worker that leaves the others points at its data (a bad shard or batch) or its hardware
    (torchtitan logs the largest loss across ranks for this reason).

    Args:
        base_trial: a trial written by several workers (``include_workers="all"`` on the hook).
        collection_names: collections of loss tensors.
        tensor_regex: regexes of loss tensor names.
        use_losses_collection: default True: also the ``losses`` collection when present (with
            nothing selected, tensors whose name contains "loss", as LossNotDecreasing).
        rel_threshold: default 0.2, > 0: |x_worker - median| / max(|median|, epsilon). On
            SpikeBench two workers' healthy losses differ by a few percent; a worker fed
            shuffled targets has a loss 1.9 times the other's, a deviation of 0.3 from the
            median of two.
        z_threshold: default 6.0, > 0.
        window: default 50, >= 2.
        min_history: default 10, in [2, window]: the worker's deviations the window needs
            before it is judged (a warm-up).
        epsilon: default 1e-8, > 0: the smallest denominator.
        grad_norms: default True: also the global gradient norms when the trial has them.

    With two workers the median is their mean and both deviate alike: the finding names the
    one further away (either may be the culprit). Each loss and mode is a series of its own.
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 use_losses_collection: Any = True, rel_threshold: Any = 0.2,
                 z_threshold: Any = 6.0, window: Any = 50, min_history: Any = 10,
                 epsilon: Any = 1e-8, grad_norms: Any = True, action_str: Any = None) -> None:
        name = type(self).__name__
        super().__init__(base_trial, action_str, 2)
        self.use_losses_collection = as_bool(name, "use_losses_collection", use_losses_collection)
        self.collection_names, self.tensor_regex, self._selection = loss_tensors(
            name, base_trial, collection_names, tensor_regex, self.use_losses_collection)
        workers = base_trial.workers()
        if len(workers) < 2 and base_trial.num_workers < 2:
            raise MltraceValueError(
                f"{name} compares the workers of a distributed run and trial "
                f"{base_trial.name!r} holds one worker's values ({', '.join(workers) or 'none'}): "
                "save every worker with include_workers='all' on the hook")
        self.rel_threshold = as_float(name, "rel_threshold", rel_threshold, 0, inclusive=False)
        self.z_threshold = as_float(name, "z_threshold", z_threshold, 0, inclusive=False)
        self.window = int_param(name, "window", window, 2)
        self.min_history = int_param(name, "min_history", min_history, 2)
        check_min_history(name, self.min_history, self.window)
        self.epsilon = as_float(name, "epsilon", epsilon, 0, inclusive=False)
        self.grad_norms = as_bool(name, "grad_norms", grad_norms)
        self._grad_names = SignalNames(GRAD_NORMS, None)
        self._spreads: dict[str, dict[int, _Spread | None]] = {}

    def _tensors(self) -> list[str]:
        names = self._selection.names(self.base_trial)
        if self.grad_norms:
            norms, model_wide = grad_norm_names(self.base_trial, self._grad_names)
            names = [*names, *sorted(n for n in norms if n in model_wide)]
        return names

    def _spread(self, name: str, step: int) -> _Spread | None:
        cache = self._spreads.setdefault(name, {})
        if step in cache:
            return cache[step]
        by_worker = self.base_trial.index_entries(name).values.get(step, {})
        values = {w: v for w in sorted(by_worker)
                  if (v := self._history.scalar(name, step, w)) is not None}
        finite = sorted(v for v in values.values() if math.isfinite(v))
        spread = None
        if len(values) >= 2 and finite:
            median = _median(finite)
            scale = max(abs(median), self.epsilon)
            deviations = {w: abs(v - median) / scale if math.isfinite(v) else math.inf
                          for w, v in values.items()}
            spread = _Spread(median, values, deviations)
        cache[step] = spread
        return spread

    def _forget(self, name: str, oldest: int) -> None:
        """Drop cached spreads that no window from here on needs (in-order runs)."""
        cache = self._spreads.get(name, {})
        if len(cache) > 2 * (self.window + 1):
            for old in [s for s in cache if s < oldest]:
                del cache[old]

    def invoke_at_step(self, step: int) -> bool:
        mode = step_mode(self.base_trial, step)
        findings = []
        for name in self.signal_tensors(self._tensors(), step):
            spread = self._spread(name, step)
            if spread is None:
                continue
            earlier = self._history.steps_before(name, step, self.window)
            if earlier:
                self._forget(name, earlier[0])
            label, n = mode_label(name, mode), len(spread.values)
            worst = None
            for worker, deviation in spread.deviations.items():
                value = spread.values[worker]
                if not math.isfinite(value):
                    findings.append(f"{label} of worker {worker} is {value} while the median of "
                                    f"{n} workers is {fmt(spread.median)}")
                    continue
                if deviation <= self.rel_threshold:
                    continue
                past = [d for s in earlier if (p := self._spread(name, s)) is not None
                        and math.isfinite(d := p.deviations.get(worker, math.nan))]
                if len(past) < self.min_history:
                    continue
                z = float(robust_z(deviation, stack(past))[0])
                if z > self.z_threshold and (worst is None or deviation > worst[1]):
                    worst = (worker, deviation, z, len(past))
            if worst is not None:
                worker, deviation, z, count = worst
                findings.append(
                    f"{label} of worker {worker} is {fmt(spread.values[worker])}, "
                    f"{fmt(deviation)} x the median {fmt(spread.median)} of {n} workers away "
                    f"(rel_threshold {self.rel_threshold:g}); the deviation's robust z-score "
                    f"against this worker's last {count} steps is {fmt(z)} (z_threshold "
                    f"{self.z_threshold:g})")
        return self.report_findings(step, findings)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


__all__ = ["WorkerDivergence"]
