"""The flight recorder's triggers (mltrace.capture.flight_recorder): each step's checks for a
non-finite value and a loss spike, and the requests for a dump they and the outside make.

Most steps are finite and calm, so the check reads the step's reductions in one copy and, while
they are all finite, calls no numpy function; only a step that fails is read tensor by tensor,
to name the first tensor in execution order that held a NaN or an infinity.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import replace

import numpy as np

from mltrace.capture.flight_recorder_state import RecordedStep, RecorderState
from mltrace.format.flight_record import FirstNonFinite
from mltrace.reductions import all_finite

logger = logging.getLogger("mltrace.flight_recorder")


class RecorderTriggers(RecorderState):
    """The flight recorder's per-step checks and its requests for a dump."""

    def trigger(self, kind: str, reason: str) -> bool:
        """Ask for a dump at the end of the current step (a rule's request, an exception, the
        user); False if the run has had its ``max_dumps`` already."""
        with self._lock:
            return self._request(kind, reason, None)

    def _request(self, kind: str, reason: str, first: FirstNonFinite | None = None) -> bool:
        """Ask for a dump at the end of the step (``first``: the non-finite tensor that asked);
        False if none will come of it."""
        if self._after_left > 0 and self._pending is None and self._dump is not None:
            # The steps after a dump are being written at full resolution already: a trigger
            # now (a loss spike's aftermath, the NaN that followed it) adds no dump.
            if first is not None and self.record.first_nonfinite is None:
                self.record.first_nonfinite = first
                self.record.dumps[-1] = self._dump = replace(self._dump, first_nonfinite=first)
                self._record_changed = True
                logger.error("flight recorder: first non-finite tensor: %s (%s, tensor %d of step "
                             "%d, %s), in the steps written after the %s dump", first.tensor,
                             first.phase, first.position, first.step, first.worker,
                             self._dump.trigger)
            logger.info("flight recorder: %s (%s) while writing the steps after a dump", kind, reason)
            return False
        if len(self.record.dumps) + (self._pending is not None) >= self.config.max_dumps:
            logger.warning("flight recorder: not dumping for %s (%s): this run dumped %d times "
                           "already (max_dumps)", kind, reason, self.config.max_dumps)
            return False
        if self._pending is None:
            self._pending, self._first = (kind, reason), first
        elif first is not None and self._first is None:
            self._first = first
        return True

    def _check_nonfinite(self, step: RecordedStep) -> FirstNonFinite | None:
        # Every reduction finite means every tensor is (each has its min and max among them).
        # Most steps end here, so this takes one copy and no numpy call (the first numpy call
        # of a step costs ~9 us on a CPU after the training step has run: measured).
        if step.flat is not None:
            finite = all_finite(step.flat.tolist())
        else:  # a step that recorded nothing is finite
            finite = not step.started or self.adapter.reductions_finite(step.started)
        if finite:
            self._armed = True
            return None
        flat = self._to_host(step)
        bad = []
        for position, tensor in enumerate(self._layout(step)):
            if step.excused is not None and tensor.name.startswith(step.excused):
                continue
            checked = [tensor.offset] if tensor.scalar else [tensor.offset + i for i in self._check_positions]
            if not np.isfinite(flat[checked]).all():
                bad.append((position, tensor.name))
        if not bad:  # only a std, a norm or the sum overflowed, or excused gradients
            self._armed = True
            return None
        position, name = bad[0]
        return FirstNonFinite(name, step.step, step.mode.name, step.mode_step, self.worker,
                              self.adapter.tensor_phase(name), position, [n for _, n in bad[:20]])

    def _loss_values(self, step: RecordedStep) -> list[tuple[str, float]]:
        """The step's losses read on the host. Without copies the whole step is moved (one
        copy, which the non-finite check then reads too); with copies that would compute every
        reduction of the step, so the losses' own handles are read (one small copy)."""
        losses, step.losses = step.losses, []
        if not losses:
            return []
        if self._copies is None:
            flat = self._to_host(step)
            return [(tensor.name, float(flat[tensor.offset])) for tensor, _ in losses]
        values = self.adapter.reductions_to_flat([started for _, started in losses])
        return [(tensor.name, float(value)) for (tensor, _), value in zip(losses, values.tolist())]

    def _check_loss_spike(self, step: RecordedStep, losses: list[tuple[str, float]]) -> str | None:
        """Why a loss of ``step`` is a spike (above ``loss_spike`` times its median over the
        last ``loss_window`` steps of its mode), or None."""
        limit = self.config.loss_spike
        if limit is None:
            return None
        found = None
        for name, value in losses:
            # per mode: an evaluation's loss is not a spike of the training loss
            history = self._losses.setdefault((name, step.mode), deque(maxlen=self.config.loss_window))
            if len(history) == history.maxlen and np.isfinite(value):
                median = statistics.median(history)
                if median > 0 and value > limit * median and found is None:
                    found = (f"{name}={value:.6g} at step {step.step} is above {limit:g} x "
                             f"its median {median:.6g} over the last {len(history)} steps")
            if np.isfinite(value):
                history.append(value)
        return found
