"""Step, mode and worker queries of ``Trial``: which steps were saved, in which mode, whether a
step can be read now, and waiting for the steps of a live run.

Steps are mode steps when a mode is given and global steps for GLOBAL (the default). Methods
that answer from storage refresh a live trial first; ``saved_steps``, ``to_global_step`` and
``to_mode_steps`` answer from the index read so far.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import NoReturn

from mltrace.exceptions import NoMoreData, StepNotYetAvailable, StepUnavailable
from mltrace.modes import ModeKeys, mode_from
from mltrace.trials.refresh import TrialRefresh, env_seconds

#: How long wait_for_steps waits by default (seconds); MLTRACE_STEP_WAIT overrides.
DEFAULT_STEP_TIMEOUT = 3600.0


class StepState(Enum):
    """Whether a step can be read: smdebug's three answers."""

    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


class StepQueries(TrialRefresh):
    """The steps, modes and workers of a trial, and whether a step is (or will be) readable."""

    # -- what was saved (refreshes a live trial) -----------------------------------------------
    def steps(self, mode: ModeKeys | str = ModeKeys.GLOBAL,
              show_incomplete_steps: bool = False) -> list[int]:
        """Saved steps of ``mode`` (mode steps; global steps for GLOBAL), complete ones only
        unless ``show_incomplete_steps``."""
        self.maybe_refresh()
        steps = set(self._index.step_workers)
        if not show_incomplete_steps:
            steps = {s for s in steps if self.is_step_complete(s)}
        return self._index.steps_of(steps, mode_from(mode))

    def modes(self) -> list[ModeKeys]:
        """Modes of the saved steps."""
        self.maybe_refresh()
        return self._index.modes()

    def mode(self, global_step: int) -> ModeKeys | None:
        """The mode of a global step (None if unknown)."""
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step: int) -> int | None:
        """The mode step of a global step (None if unknown)."""
        return self.mode_modestep(global_step)[1]

    def mode_modestep(self, global_step: int) -> tuple[ModeKeys | None, int | None]:
        """(mode, mode step) of a global step."""
        if global_step not in self._index.global_to_mode:
            self.maybe_refresh()
        return self._index.global_to_mode.get(global_step, (None, None))

    def global_step(self, mode: ModeKeys | str, mode_step: int) -> int | None:
        """The global step of a mode step (None if unknown)."""
        mode = mode_from(mode)
        g = self._index.to_global(mode_step, mode)
        if g is None:
            self.maybe_refresh()
            g = self._index.to_global(mode_step, mode)
        return g

    def workers(self) -> list[str]:
        """Worker names of the trial."""
        self.maybe_refresh()
        return self.workers_seen()

    def workers_seen(self) -> list[str]:
        """Worker names of the files read so far, without looking for new ones (what a view
        asks many times while it reads one answer)."""
        return sorted(self._workers)

    # -- whether a step can be read --------------------------------------------------------------
    def has_passed_step(self, step: int, mode: ModeKeys | str = ModeKeys.GLOBAL) -> StepState:
        """Whether ``step`` can be read now, never will be, or may be later (smdebug's rules)."""
        mode = mode_from(mode)
        self.maybe_refresh()
        seen = self._index.sorted_steps(mode)
        pos = bisect.bisect_left(seen, step)
        if pos == len(seen):
            return StepState.UNAVAILABLE if self.loaded_all_steps else StepState.NOT_YET_AVAILABLE
        first = seen[pos]
        g = self._index.to_global(first, mode)
        if g is None:  # cannot happen: ``seen`` lists the steps the index maps
            return StepState.NOT_YET_AVAILABLE
        if first > step:
            if self.last_complete_step >= g:
                return StepState.UNAVAILABLE
            return StepState.NOT_YET_AVAILABLE
        return StepState.AVAILABLE if self.is_step_complete(g) else StepState.NOT_YET_AVAILABLE

    def wait_for_steps(self, required_steps: Iterable[int],
                       mode: ModeKeys | str = ModeKeys.GLOBAL,
                       timeout: float | None = None) -> None:
        """Wait until every step of ``required_steps`` is available.

        Raises:
            StepUnavailable: a step was skipped by training.
            NoMoreData: training ended before the step.
            StepNotYetAvailable: ``timeout`` seconds passed (default 3600, MLTRACE_STEP_WAIT).
        """
        mode = mode_from(mode)
        if timeout is None:
            timeout = env_seconds("MLTRACE_STEP_WAIT", DEFAULT_STEP_TIMEOUT)
        deadline = time.monotonic() + timeout
        for step in sorted(set(required_steps)):
            while True:
                state = self.has_passed_step(step, mode)
                if state is StepState.AVAILABLE:
                    break
                if state is StepState.UNAVAILABLE:
                    self.raise_for_missing_step(step, mode)
                if time.monotonic() >= deadline:
                    raise StepNotYetAvailable(step, mode)
                time.sleep(self.poll_interval)
                self.maybe_refresh(force=True)

    def raise_for_missing_step(self, step: int, mode: ModeKeys | str = ModeKeys.GLOBAL,
                               tensor_name: str | None = None) -> NoReturn:
        """Raise the error that says why ``step`` of ``mode`` cannot be read.

        Args:
            step: a step of ``mode`` that the index does not hold.
            mode: its mode.
            tensor_name: the tensor being read, if any: then a step that may still be written
                raises StepNotYetAvailable.

        Raises:
            NoMoreData: training ended before ``step``.
            StepNotYetAvailable: reading a tensor at a step training may still write.
            StepUnavailable: otherwise (training skipped the step).
        """
        mode = mode_from(mode)
        seen = self._index.sorted_steps(mode)
        if self.loaded_all_steps and (not seen or step > seen[-1]):
            raise NoMoreData(step, mode, seen[-1] if seen else None)
        if (tensor_name is not None
                and self.has_passed_step(step, mode) is StepState.NOT_YET_AVAILABLE):
            raise StepNotYetAvailable(step, mode)
        raise StepUnavailable(step, mode)

    # -- the index as read so far (no refresh) -----------------------------------------------------
    def saved_steps(self, mode: ModeKeys | str = ModeKeys.GLOBAL) -> Sequence[int]:
        """Every step read so far in ``mode``, complete or not (mode steps; global steps for
        GLOBAL), sorted; no refresh. The sequence is cached until the next index file is read,
        so that step lookups on long runs stay logarithmic: do not change it."""
        return self._index.sorted_steps(mode_from(mode))

    def to_global_step(self, step: int, mode: ModeKeys | str = ModeKeys.GLOBAL) -> int | None:
        """The global step of ``step`` of ``mode`` from the index read so far (no refresh; see
        ``global_step`` for a lookup that refreshes); a GLOBAL step maps to itself when saved.

        Returns:
            the global step, or None when no index file read so far has it.
        """
        return self._index.to_global(step, mode_from(mode))

    def to_mode_steps(self, global_steps: Iterable[int],
                      mode: ModeKeys | str = ModeKeys.GLOBAL) -> list[int]:
        """``global_steps`` as sorted steps of ``mode``: mode steps of those saved in ``mode``
        (others left out), or the global steps themselves for GLOBAL."""
        return self._index.steps_of(global_steps, mode_from(mode))
