"""Read-only view of one tensor of a trial: values, reductions and shapes over steps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from mltrace.exceptions import (
    CorruptRecordError,
    InvalidWorker,
    ShapeUnavailableForStep,
    TensorUnavailableForStep,
)
from mltrace.modes import ModeKeys, mode_from
from mltrace.reductions import canonical_name, compute

if TYPE_CHECKING:
    from mltrace.trials.index import Location
    from mltrace.trials.trial import Trial

T = TypeVar("T")


class Tensor:
    """A tensor of a trial; every method refreshes a live trial before answering.

    Steps are mode steps when a mode is given, global steps for GLOBAL (the default).
    Reads go through the trial's public reader API (``Trial.index_entries``,
    ``Trial.read_tensor``, ...).
    """

    def __init__(self, name: str, trial: Trial) -> None:
        self.name = name
        self.original_name = name
        self.trial = trial

    # -- steps ------------------------------------------------------------------------------------
    def steps(self, mode: ModeKeys | str = ModeKeys.GLOBAL,
              show_incomplete_steps: bool = False) -> list[int]:
        """Steps of ``mode`` where this tensor, a reduction of it or its shape was saved."""
        mode = mode_from(mode)
        trial = self.trial
        trial.maybe_refresh()
        steps = trial.index_entries(self.name).global_steps()
        if not show_incomplete_steps:
            steps = {s for s in steps if trial.is_step_complete(s)}
        return trial.to_mode_steps(steps, mode)

    def value_steps(self, mode: ModeKeys | str = ModeKeys.GLOBAL,
                    worker: str | None = None) -> list[int]:
        """Steps of ``mode`` where the raw value (not only reductions or the shape) was saved, by
        ``worker`` when given; reads the index only."""
        mode = mode_from(mode)
        values = self.trial.index_entries(self.name).values
        to_global = self.trial.to_global_step
        return [s for s in self.steps(mode)
                if (g := to_global(s, mode)) in values and (worker is None or worker in values[g])]

    def prev_steps(self, step: int, n: int | None = None,
                   mode: ModeKeys | str = ModeKeys.GLOBAL) -> list[int]:
        """The last ``n`` steps (all if None) at or before ``step``."""
        earlier = [s for s in self.steps(mode) if s <= step]
        return earlier if n is None else earlier[-n:]

    def workers(self, step: int, mode: ModeKeys | str = ModeKeys.GLOBAL) -> list[str]:
        """Workers that saved this tensor at ``step``."""
        g = self._global(step, mode_from(mode))
        entries = self.trial.index_entries(self.name)
        found = (set(entries.values.get(g, {})) | set(entries.reductions.get(g, {}))
                 | set(entries.shapes.get(g, {})))
        return sorted(found)

    # -- values -----------------------------------------------------------------------------------
    def value(self, step_num: int, mode: ModeKeys | str = ModeKeys.GLOBAL,
              worker: str | None = None) -> np.ndarray:
        """The saved value at ``step_num``.

        Raises:
            TensorUnavailableForStep: not saved at that step (maybe only reductions were).
            StepUnavailable, NoMoreData: the step itself was never saved / training ended.
        """
        return self._reading(step_num, mode, lambda: self._value(step_num, mode_from(mode), worker))

    def _value(self, step_num: int, mode: ModeKeys, worker: str | None) -> np.ndarray:
        g = self._global(step_num, mode)
        entries = self.trial.index_entries(self.name)
        by_worker = entries.values.get(g)
        if not by_worker:
            raise TensorUnavailableForStep(self.name, step_num, mode,
                                           has_reductions=g in entries.reductions)
        loc = by_worker[self._pick_worker(by_worker, worker)]
        return self.trial.read_tensor(loc, self.name, step_num, mode)

    def values(self, mode: ModeKeys | str = ModeKeys.GLOBAL,
               worker: str | None = None) -> dict[int, np.ndarray]:
        """{step: value} over the complete steps of ``mode`` where the value was saved."""
        mode = mode_from(mode)
        trial = self.trial
        entries = trial.index_entries(self.name)
        wanted: list[tuple[int, Location]] = []
        for step in self.steps(mode):
            g = trial.to_global_step(step, mode)
            by_worker = entries.values.get(g) if g is not None else None
            if by_worker:
                wanted.append((step, by_worker[self._pick_worker(by_worker, worker)]))
        try:  # one batch: remote stores fetch the records in parallel
            arrays = trial.read_tensors([loc for _, loc in wanted])
            return {step: array for (step, _), array in zip(wanted, arrays)}
        except (FileNotFoundError, CorruptRecordError):  # one by one, each with value()'s checks
            return {step: self.value(step, mode, worker) for step, _ in wanted}

    def reduction_value(
        self, step_num: int, reduction_name: str, mode: ModeKeys | str = ModeKeys.GLOBAL,
        worker: str | None = None, abs: bool = False,
    ) -> np.ndarray:
        """A reduction at ``step_num``: the stored one, else computed from the raw value.

        Raises:
            TensorUnavailableForStep: neither the reduction nor the raw value was saved.
        """
        mode = mode_from(mode)
        name = canonical_name(reduction_name)
        return self._reading(step_num, mode,
                             lambda: self._reduction_value(step_num, name, mode, worker, abs))

    def _reduction_value(self, step_num: int, name: str, mode: ModeKeys, worker: str | None,
                         abs: bool) -> np.ndarray:
        g = self._global(step_num, mode)
        entries = self.trial.index_entries(self.name)
        stored = entries.reductions.get(g)
        if stored:
            w = self._pick_worker(stored, worker)
            loc = stored[w].get((name, abs))
            if loc is not None:
                return self.trial.read_tensor(loc, self.name, step_num, mode).reshape(())
        if g in entries.values:
            result = compute(name, self.value(step_num, mode, worker), abs)
            if result is not None:
                return result
        raise TensorUnavailableForStep(self.name, step_num, mode)

    def reduction_values(self, step_num: int, mode: ModeKeys | str = ModeKeys.GLOBAL,
                         worker: str | None = None) -> dict[tuple[str, bool], np.ndarray]:
        """{(reduction, abs): value} of the reductions stored at ``step_num``."""
        mode = mode_from(mode)
        return self._reading(step_num, mode,
                             lambda: self._reduction_values(step_num, mode, worker))

    def _reduction_values(self, step_num: int, mode: ModeKeys,
                          worker: str | None) -> dict[tuple[str, bool], np.ndarray]:
        g = self._global(step_num, mode)
        stored = self.trial.index_entries(self.name).reductions.get(g) or {}
        if not stored:
            return {}
        w = self._pick_worker(stored, worker)
        return {k: self.trial.read_tensor(loc, self.name, step_num, mode).reshape(())
                for k, loc in stored[w].items()}

    def shape(self, step_num: int, mode: ModeKeys | str = ModeKeys.GLOBAL,
              worker: str | None = None) -> tuple[int, ...]:
        """The shape at ``step_num``, from the index (save_shape) or from the value."""
        mode = mode_from(mode)
        g = self._global(step_num, mode)
        entries = self.trial.index_entries(self.name)
        shapes = entries.shapes.get(g)
        if shapes:
            return tuple(shapes[self._pick_worker(shapes, worker)])
        if g in entries.values:
            return tuple(self.value(step_num, mode, worker).shape)
        raise ShapeUnavailableForStep(self.name, step_num, mode)

    # -- helpers ----------------------------------------------------------------------------------
    def _reading(self, step: int, mode: ModeKeys | str, read: Callable[[], T]) -> T:
        """``read()``; once more if a record failed its check because its step was rewritten
        after the trial indexed it (a job restarted into the out_dir, see Trial.reload_step).
        If the step is being rewritten right now, the second read raises as for a missing step."""
        try:
            return read()
        except CorruptRecordError:
            g = self.trial.to_global_step(step, mode)
            if g is None or not self.trial.reload_step(g):
                raise
        return read()

    def _global(self, step: int, mode: ModeKeys) -> int:
        """The global step of ``step``, refreshing once on a miss (not while the trial's
        ``dynamic_refresh`` is off: inside ``no_refresh`` a step written since the last refresh
        raises StepNotYetAvailable, as smdebug's does); else raise why it is missing."""
        g = self.trial.to_global_step(step, mode)
        if g is None and self.trial.dynamic_refresh:
            self.trial.maybe_refresh(force=True)
            g = self.trial.to_global_step(step, mode)
        if g is None:
            self.trial.raise_for_missing_step(step, mode, self.name)
        return g

    @staticmethod
    def _pick_worker(by_worker: Mapping[str, object], worker: str | None) -> str:
        if worker is None:
            return min(by_worker)
        if worker not in by_worker:
            raise InvalidWorker(worker)
        return worker

    def __repr__(self) -> str:
        return f"<Tensor {self.name!r} of trial {self.trial.name!r}>"
