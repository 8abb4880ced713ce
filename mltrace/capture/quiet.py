"""The quiet lane: a step boundary at which the hook has nothing to do, in one call.

Most boundaries of a training with a save interval are quiet ones (``StepClock.quiet`` counts
them ahead, from ``SavePlan.quiet_steps``): nothing is due, nothing is watched, and the hook only
counts the step. ``Hook.begin_step`` does that too, but a framework's step callback reaches it
through about ten Python calls (error policy, the adapter's checks, the hook's, the clock's, the
stop signal's), and in place each costs about a microsecond: the model's kernels have just left
the interpreter's caches cold. On a 0.3-ms PyTorch step that was 3% of the step
(bench/README.md, "A quiet lane"). The lane is one function over the same state that takes the
common case and refuses everything else, which then goes the full way:

- a step of another mode than the one the quiet steps were counted for (``set_mode`` between);
- a look for a rule's stop signal due (``StopSignal.poll``, about once a second), or a request
  already seen;
- a flight recorder that stopped for good (max_dumps, its budget).

A step the flight recorder records (``Hook.recording_only``) takes the lane too: the lane ends
the recorded step and begins the next as ``Hook.begin_step`` does (``Recording.end_quiet_step``,
``begin_quiet_step``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mltrace.hook import Hook


def quiet_lane(hook: Hook) -> Callable[[], bool]:
    """A function that begins the next step of ``hook`` and returns True if it is a quiet one
    that needs nothing else (see the module's docstring); else it changes nothing and returns
    False, and the caller calls ``hook.begin_step()``."""
    clock, stop = hook.clock, hook.stop
    monotonic = time.monotonic

    def take() -> bool:
        if (clock.quiet <= 0 or clock.mode is not clock.step_mode or stop.requested is not None
                or monotonic() >= stop.next_look):
            return False
        only = hook.recording_only
        if only is not None and not only.end_quiet_step(hook.outputs, hook.writer, ended=hook.step_written):
            clock.quiet = 0  # the recorder stopped: the next step is decided in full
            return False
        clock.quiet -= 1
        clock.advance()
        hook.step_written, hook.step_active = False, only is not None
        if only is not None:
            only.begin_quiet_step(clock)
        return True

    return take
