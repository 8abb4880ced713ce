"""The flight recorder: the last N steps of chosen collections kept in memory, written to the
trial when something goes wrong.

A run that saves every 500 steps holds steps 12,000 and 12,500 when its loss turns NaN at 12,345.
With a recorder, every step's reductions of the recorded collections (and raw values where asked)
are computed where the tensors live and kept in a ring of at most ``steps`` steps within a memory
budget. A trigger (a non-finite value, a loss spike, a rule's request, an exception escaping the
training step, or ``hook.dump_flight_recorder(reason)``) writes the ring to the trial as ordinary
steps, keeps writing the next ``after_steps`` steps at full resolution, and records why (see
mltrace.format.flight_record), including the first tensor in execution order that was not finite.

Costs per recorded tensor and step: the reductions (a few device ops, nothing waits for them), or
where the framework has a ring of copies (PyTorch: mltrace.pytorch.copy_ring) and the copies of
the ring's steps fit in half the budget, one copy, reduced only when the step is read; per step:
one device-to-host copy for the non-finite check and the loss spike (with copies: a sum over
them and the other reductions, and the losses' values apart), none otherwise until a dump.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mltrace.capture.flight_recorder_dumps import RecorderDumps
from mltrace.capture.flight_recorder_keep import RecorderKeep
from mltrace.capture.flight_recorder_triggers import RecorderTriggers


class FlightRecorder(RecorderKeep, RecorderTriggers, RecorderDumps):
    """The ring of recorded steps of one hook, its triggers and its dumps (see module docstring).

    The hook calls :meth:`begin_step`, :meth:`observe` for each tensor of a recorded collection,
    :meth:`end_step` once the step's own files are written, and :meth:`trigger` for triggers that
    come from outside the step (a rule's request, an exception, the user).

    Its parts, each a class of its own module that shares the recorder's state
    (mltrace.capture.flight_recorder_state): what a step keeps and the per-tensor path
    (flight_recorder_keep), the checks and triggers (flight_recorder_triggers), the ring and
    its memory budget (flight_recorder_ring), the dumps (flight_recorder_dumps). Closing a
    step, here, joins them.

    Args:
        config: what to keep and when to dump.
        adapter: the framework's reductions and copies.
        worker: this process's worker name (in the record file).
    """

    def end_step(self, write_current: Callable[[list[tuple[str, np.ndarray]]], None],
                 saved: bool = False) -> None:
        """Close the current step: check it (non-finite values, a loss spike), then either write
        it with ``write_current`` (into the step's own file, still open) because a trigger is
        pending or the step is one of those after a trigger, or keep it in the ring. The ring is
        written by :meth:`dump_pending`, once the step's file is closed. A step the hook saves
        itself (``saved``) gets its records now and is kept in the ring as written already: a
        dump rewriting its file would lose what the hook saved there."""
        step, self.current = self.current, None
        if step is None:
            return
        with self._lock:
            self._last = step
            config = self.config
            spikes = config.loss_spike is not None
            if step.started:
                step.started = self._pack(step.started)
            losses = self._loss_values(step) if spikes else None
            if config.nonfinite or spikes:
                first = self._check_nonfinite(step) if config.nonfinite else None
                spike = self._check_loss_spike(step, losses) if losses else None
                if first is not None and self._armed:
                    self._armed = False
                    self._request("nonfinite", f"{first.tensor} held a NaN or an infinity at step "
                                  f"{first.step}", first)
                elif spike is not None and step.step >= self._spike_quiet_until:
                    if self._request("loss_spike", spike):
                        # the loss takes a while to settle after a spike: one dump per spike
                        self._spike_quiet_until = step.step + self.config.loss_window
            keep = self._after_left > 0 or self._pending is not None
            if keep or saved:
                write_current(self._records(step))
            if not keep:
                step.saved = saved
                self._push(step)
            elif self._pending is None and self._dump is not None:
                self._dump.steps_after.append(step.step)
                self._after_left -= 1
                self._record_changed = True
