"""The flight recorder's ring (mltrace.capture.flight_recorder): the last ``steps`` steps kept
within ``memory_budget``, the oldest dropped first.

The budget covers the ring's steps and the slots of the framework's copies, if any (at most
half the budget): a step that alone takes more than the budget turns the recorder off, with an
error that names the budget it needs, rather than keep a ring that holds no step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from mltrace.capture.flight_recorder_state import RecordedStep, RecorderState
from mltrace.exceptions import MltraceValueError

logger = logging.getLogger("mltrace.flight_recorder")


class RecorderRing(RecorderState):
    """The flight recorder's ring of kept steps and its memory budget."""

    @property
    def ring_bytes(self) -> int:
        """The memory the recorder holds: its ring's steps and the slots of its copies."""
        return self._steps_bytes + (self._copies.nbytes if self._copies is not None else 0)

    def check_budget(self, tensors: Iterable[tuple[str, int]],
                     member: Callable[[str], bool]) -> None:
        """Raise if the tensors known before training (a model's parameters and gradients:
        (name, bytes)) that the recorder would keep already take more than the budget per step.

        Raises:
            MltraceValueError: naming the bytes one step needs, the budget and the fixes.
        """
        sizes = [nbytes for name, nbytes in tensors if member(name)]
        need = self.config.step_bytes(sizes)
        if need > self.config.memory_budget:
            raise MltraceValueError(
                f"FlightRecorderConfig(memory_budget={self.config.memory_budget}) cannot hold one "
                f"step: the {len(sizes)} parameters and gradients it records take {need} bytes per "
                f"step ({'raw copies and ' if self.config.raw else ''}{len(self.items)} reductions "
                f"each), more with activations. Raise memory_budget to at least "
                f"{need * self.config.steps} for {self.config.steps} steps, record fewer "
                "collections" + (", or pass raw=False" if self.config.raw else ""))

    def _push(self, step: RecordedStep) -> None:
        """Keep ``step`` in the ring, dropping the oldest steps past ``steps`` or the budget."""
        budget = self.config.memory_budget
        if step.nbytes > budget:
            if not self._warned_budget:
                self._warned_budget = True
                logger.error(
                    "flight recorder turned off: one step takes %d bytes, above "
                    "FlightRecorderConfig(memory_budget=%d); raise the budget (for %d steps: %d) or "
                    "record fewer collections%s", step.nbytes, budget, self.config.steps,
                    step.nbytes * self.config.steps, " or pass raw=False" if self.config.raw else "")
            self._stop_recording()
            return
        self.ring.append(step)
        self._steps_bytes += step.nbytes
        budget -= self._copies.nbytes if self._copies is not None else 0
        while len(self.ring) > self.config.steps or self._steps_bytes > budget:
            self._steps_bytes -= self.ring.popleft().nbytes

    def _stop_recording(self) -> None:
        """Record nothing more and free the ring (the hook's callbacks skip steps again)."""
        self.enabled = False
        self.ring.clear()
        self._steps_bytes = 0
        if self._copies is not None:
            self._copies.release()
