"""The step/mode clock of a hook: the global step, the current mode and each mode's own step."""

from __future__ import annotations

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys, mode_from


class StepClock:
    """Counts steps as smdebug does: callback hooks start at -1, so the first step is 0; each
    step also advances the current mode's step, and the GLOBAL mode step follows the global step.
    """

    def __init__(self) -> None:
        self.step = -1
        self.mode = ModeKeys.GLOBAL
        self.mode_steps: dict[ModeKeys, int] = {m: -1 for m in ModeKeys}
        #: The mode the current step began in (its TensorBoard run, even after set_mode).
        self.step_mode = ModeKeys.GLOBAL
        #: Coming steps of this mode at which the hook has nothing to do (set by the hook from
        #: SavePlan.quiet_steps; 0 after anything that could change that; mltrace.capture.quiet takes
        #: them).
        self.quiet = 0

    @property
    def mode_step(self) -> int:
        """The current mode's step."""
        return self.mode_steps[self.mode]

    @property
    def started(self) -> bool:
        """True once the first step began."""
        return self.step >= 0

    def set_mode(self, mode: ModeKeys | str) -> None:
        """Set the mode of the following steps."""
        self.mode = mode_from(mode)

    def advance(self, step: int | None = None) -> None:
        """Begin the next step; ``step`` jumps to that number instead of counting up by one
        (XGBoost's boosting round, also when training resumes). Steps only go up."""
        if step is not None and step <= self.step:
            raise MltraceValueError(f"begin_step(step={step}): steps only go up; the current step is {self.step}")
        if step is not None:
            self.step = self.mode_steps[self.mode] = step - 1
        self.step += 1
        self.mode_steps[self.mode] += 1
        if self.mode is not ModeKeys.GLOBAL:
            self.mode_steps[ModeKeys.GLOBAL] = self.step
        self.step_mode = self.mode

    def counts_to(self, step: int | None) -> bool:
        """True if beginning ``step`` is counting up by one: None, or a step numbered by the
        caller (XGBoost's boosting round) that is the next one, the mode's step following."""
        return step is None or (step == self.step + 1 and self.mode_step == self.step)
