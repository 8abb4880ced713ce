"""The flight recorder's dumps (mltrace.capture.flight_recorder): the ring's steps written to the
trial as ordinary steps, and the worker's flight record (mltrace.format.flight_record) that says
why.

A dump happens between steps, when no step file is open: the step that triggered it is written
into its own file by ``end_step``, and the ``after_steps`` steps that follow are written at full
resolution the same way before the record is written again with them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from mltrace.capture.flight_recorder_ring import RecorderRing
from mltrace.capture.flight_recorder_state import RecordedStep
from mltrace.format.flight_record import Dump, record_key
from mltrace.modes import ModeKeys

if TYPE_CHECKING:
    from mltrace.writer import TrialWriter

logger = logging.getLogger("mltrace.flight_recorder")


class RecorderDumps(RecorderRing):
    """The flight recorder's writing of its ring and of its record file."""

    def dump_pending(self, writer: TrialWriter | None) -> bool:
        """Between steps (no step file open): write the ring's steps if a trigger is pending, and
        the record file if it changed; True if a dump happened."""
        if self._pending is None and not self._record_changed:
            return False  # most steps (read without the lock: a trigger it misses waits a step)
        with self._lock:
            if writer is None:
                return False
            if self._pending is None:
                if self._record_changed and self._after_left == 0:
                    self.write_record(writer)  # with the dump's after-steps: it is complete
                    if self.record.dumps:
                        self.on_dump_complete(self.record, self.record.dumps[-1])
                    if len(self.record.dumps) >= self.config.max_dumps:
                        # nothing more can be dumped: stop paying for the recording
                        self._stop_recording()
                        logger.warning("flight recorder: stops recording after %d dumps (max_dumps)",
                                       len(self.record.dumps))
                return False
            (kind, reason), first = self._pending, self._first
            self._pending = self._first = None
            at = self._last or RecordedStep(-1, ModeKeys.GLOBAL, -1, time.time())
            before = [s for s in self._write_ring(writer) if s != at.step]
            dump = Dump(kind, reason, at.step, at.mode.name, at.mode_step, time.time(), before, [],
                        first)
            self.record.dumps.append(dump)
            if first is not None and self.record.first_nonfinite is None:
                self.record.first_nonfinite = first
            self._dump, self._after_left = dump, self.config.after_steps
            self.write_record(writer)
            log = logger.error if kind in ("nonfinite", "exception") else logger.warning
            log("flight recorder: %s at step %s (%s): wrote the %d steps before it; the next %d "
                "steps are written at full resolution%s", kind, at.step, reason, len(before),
                self.config.after_steps,
                f". First non-finite tensor: {first.tensor} ({first.phase}, tensor "
                f"{first.position} of step {first.step}, {first.worker})" if first else "")
            self.on_dump(self.record, dump)
            return True

    def write_record(self, writer: TrialWriter) -> None:
        """(Re)write this worker's record file (at a dump, after its after-steps, at close)."""
        self._record_changed = False
        if self.record.dumps:
            writer.write_file(record_key(self.worker), self.record.to_json())

    def _write_ring(self, writer: TrialWriter) -> list[int]:
        """Write the ring's steps (those the hook has not written already) and empty it; returns
        the steps the trial holds of it."""
        steps, self.ring = list(self.ring), deque()
        self._steps_bytes = 0
        written = []
        for step in steps:
            if step.saved:  # in the trial already, with its records
                written.append(step.step)
                continue
            self._to_host(step)
            writer.open_step(step.step, step.mode, step.mode_step)
            for name, array in self._records(step):
                writer.add_tensor(name, array, step.mode, step.mode_step, step.wall_time)
            if writer.close_step():
                written.append(step.step)
        return written
