"""The quiet lane: a step boundary at which the hook has nothing to do, in one call.

Most boundaries of a training with a save interval are quiet ones (``StepClock.quiet`` counts
them ahead, from ``SavePlan.quiet_steps``): nothing is due, nothing is watched, and the hook only
counts the step. ``Hook.begin_step`` takes the lane first, but a framework's step callback
reaches it through about ten Python calls (error policy, the adapter's checks, the hook's), and
in place each costs about a microsecond: the model's kernels have just left the interpreter's
caches cold. On a 0.3-ms PyTorch step that is 3% of the step. So a callback that runs at every step (the PyTorch model's pre-hook) calls the lane
itself, and ``Hook.begin_step`` only where the lane refuses, which it does for everything but
the common case:

- a step of another mode than the one the quiet steps were counted for (``set_mode`` between);
- a look for a rule's stop signal due (``StopSignal.poll``, about once a second), or a request
  already seen (``Hook.begin_step`` asks with ``look=True``: the lane then looks itself);
- a flight recorder that stopped for good (max_dumps, its budget).

A step the flight recorder records (``Hook.recording_only``) takes the lane too: the lane ends
the recorded step and begins the next as ``Hook.begin_step`` does (``Recording.end_quiet_step``,
``begin_quiet_step``).

The lane is the hook's own code: :class:`QuietLane` is a part of ``Hook``, so that the step's
flags (``step_written``, ``step_active``, ``recording_only`` and the clock's count of quiet steps)
are set by the hook alone, on one path or the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mltrace.capture.clock import StepClock
    from mltrace.capture.outputs import Outputs
    from mltrace.capture.recording import Recording
    from mltrace.capture.stop import StopSignal


class QuietLane:
    """``Hook``'s quiet lane (see the module docstring): ``take_quiet_step`` is made once, when
    the hook is built, by :meth:`_quiet_lane`."""

    clock: StepClock
    stop: StopSignal
    outputs: Outputs
    writer: Any
    step_written: bool
    step_active: bool
    recording_only: Recording | None

    def _quiet_lane(self) -> Callable[..., bool]:
        """A function ``take(step=None, look=False)`` that begins the next step and returns
        True if it is a quiet one that needs nothing else; else it changes nothing (but end a
        recorded step whose recorder stopped) and returns False, and the step goes the full way
        (``Hook.begin_step``). ``step``: the caller's step number (see ``StepClock.counts_to``);
        ``look``: look for the stop signal here instead of refusing when a look is due. A
        closure over the hook's parts: it runs at every step of every model."""
        clock, stop = self.clock, self.stop
        monotonic = time.monotonic

        def take(step: int | None = None, look: bool = False) -> bool:
            if (clock.quiet <= 0 or clock.mode is not clock.step_mode
                    or (step is not None and not clock.counts_to(step))):
                return False
            if not look and (stop.requested is not None or monotonic() >= stop.next_look):
                return False
            only = self.recording_only
            if only is not None and not only.end_quiet_step(self.outputs, self.writer,
                                                            ended=self.step_written):
                clock.quiet = 0  # the recorder stopped: the next step is decided in full
                return False
            clock.quiet -= 1  # the checks above are StepClock's for a quiet step: no second look
            clock.advance()
            self.step_written, self.step_active = False, only is not None
            if look:
                stop.poll()
            if only is not None:
                only.begin_quiet_step(clock)
            return True

        return take
