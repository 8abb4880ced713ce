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
        #: SavePlan.quiet_steps; 0 after anything that could change that: see skip_quiet).
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

    def skip_quiet(self, step: int | None = None) -> bool:
        """Begin the next step (``step``: see counts_to) if it is a quiet one (counted in
        ``quiet``, same mode): the hook does nothing else at such a boundary. False (nothing
        changed) otherwise. Kept to a few lines: it runs at most steps of a training, right after
        the model's last kernels left the interpreter's caches cold."""
        if self.quiet <= 0 or self.mode is not self.step_mode or (step is not None and not self.counts_to(step)):
            return False
        self.quiet -= 1
        self.advance()
        return True
