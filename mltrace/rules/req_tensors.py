"""RequiredTensors: the tensors (and steps) a rule needs at one step, fetched together."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from mltrace.exceptions import TensorUnavailable

if TYPE_CHECKING:
    from mltrace.trials import Trial
    from mltrace.trials.tensor import Tensor


class _TrialTensors:
    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        self.steps: dict[str, set[int]] = {}

    def add(self, name: str, steps: Iterable[int]) -> None:
        self.steps.setdefault(name, set()).update(int(s) for s in steps)


class RequiredTensors:
    """Per trial, which tensors a rule needs at which steps (``self.req_tensors`` of a Rule).

    Args:
        base_trial: the rule's base trial (``trial=None`` in methods means this one).
        other_trials: the rule's other trials.
    """

    def __init__(self, base_trial: Trial, other_trials: list[Trial] | None = None) -> None:
        self.base_trial = base_trial
        self.other_trials = list(other_trials or [])
        self._by_trial: dict[int, _TrialTensors] = {}

    def _of(self, trial: Trial | None) -> _TrialTensors:
        trial = trial or self.base_trial
        if id(trial) not in self._by_trial:
            self._by_trial[id(trial)] = _TrialTensors(trial)
        return self._by_trial[id(trial)]

    def add(self, name: str | Tensor, steps: Iterable[int], trial: Trial | None = None,
            should_match_regex: bool = False) -> None:
        """Require tensor ``name`` (a name, a regex when ``should_match_regex``, or a Tensor) at
        ``steps``.

        Raises:
            TensorUnavailable: no tensor of that name (or none matching the regex) in the trial.
        """
        entry = self._of(trial)
        tname = name if isinstance(name, str) else str(getattr(name, "name", name))
        if should_match_regex:
            names = entry.trial.tensor_names(regex=tname)
            if not names:
                raise TensorUnavailable(tname)
            for n in names:
                entry.add(n, steps)
        else:
            if not entry.trial.has_tensor(tname):
                raise TensorUnavailable(tname)
            entry.add(tname, steps)

    def get_names(self, trial: Trial | None = None) -> list[str]:
        """Names required from ``trial``."""
        return sorted(self._of(trial).steps)

    def get_tensor_steps(self, trial: Trial | None = None) -> dict[str, list[int]]:
        """{name: sorted steps} required from ``trial``."""
        return {n: sorted(s) for n, s in self._of(trial).steps.items()}

    def get(self, trial: Trial | None = None) -> list[Tensor]:
        """The required tensors of ``trial`` as Tensor objects."""
        entry = self._of(trial)
        return [entry.trial.tensor(n) for n in sorted(entry.steps)]

    def clear(self) -> None:
        """Forget every requirement (done before each step's set_required_tensors)."""
        self._by_trial.clear()

    def fetch(self) -> None:
        """Wait until every required step of every trial is available (raising StepUnavailable
        or NoMoreData as Trial.wait_for_steps does); values are then read where the rule uses
        them, one ranged read each."""
        for entry in self._by_trial.values():
            all_steps = sorted({s for steps in entry.steps.values() for s in steps})
            if all_steps:
                entry.trial.wait_for_steps(all_steps)
