"""What a trial holds at a glance: its modes and steps, workers, tensors and collections; and the
small helpers every view of several tensors needs (choosing tensors, printing a statistic).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mltrace.collections import Collection
    from mltrace.trials import Trial


@dataclass(frozen=True)
class StepSpan:
    """How many steps there are, and the first and last (None when there is none)."""

    count: int
    first: int | None
    last: int | None

    @classmethod
    def of(cls, steps: Sequence[int]) -> StepSpan:
        """The span of ascending ``steps``."""
        return cls(len(steps), steps[0] if steps else None, steps[-1] if steps else None)

    def to_dict(self) -> dict[str, int | None]:
        """``{"steps", "first", "last"}``, as the views put it in JSON."""
        return {"steps": self.count, "first": self.first, "last": self.last}


@dataclass(frozen=True)
class TrialOverview:
    """A trial's modes and steps, workers, tensors and collections.

    Attributes:
        modes: ``{mode name: StepSpan}`` of the trial's complete steps, in the trial's mode order.
        tensors: every tensor name, sorted.
        collections: ``{name: Collection}``, sorted by name.
        members: ``{collection name: its tensor names}`` (empty lists included).
        ended: the training job wrote its end marker (no step will be added).
    """

    name: str
    location: str
    workers: list[str]
    ended: bool
    modes: dict[str, StepSpan]
    tensors: list[str]
    collections: dict[str, Collection]
    members: dict[str, list[str]]

    def collections_of(self, tensor: str) -> list[str]:
        """The names of the collections ``tensor`` belongs to, sorted."""
        return self._membership.get(tensor, [])

    @functools.cached_property
    def _membership(self) -> dict[str, list[str]]:
        """``{tensor: its collections}``, built once on first use."""
        out: dict[str, list[str]] = {}
        for name, tensors in self.members.items():
            for tensor in tensors:
                out.setdefault(tensor, []).append(name)
        return out


def trial_overview(trial: Trial) -> TrialOverview:
    """The overview of ``trial`` as it is now (a live trial is refreshed first)."""
    modes = {mode.name: StepSpan.of(trial.steps(mode)) for mode in trial.modes()}
    collections = dict(sorted(trial.collections().items()))
    return TrialOverview(
        name=trial.name, location=trial.path, workers=trial.workers(), ended=trial.loaded_all_steps,
        modes=modes, tensors=trial.tensor_names(), collections=collections,
        members={name: trial.tensor_names(collection=coll) for name, coll in collections.items()})


def match_tensors(trial: Trial, patterns: str | Sequence[str]) -> list[str]:
    """Tensor names of ``trial`` chosen by names or regular expressions (``re.search``, as
    ``trial.tensor_names(regex=...)``), in the order given, each once; a pattern that is a
    tensor's exact name is that tensor only."""
    wanted = [patterns] if isinstance(patterns, str) else list(patterns)
    names = trial.tensor_names()
    out: list[str] = []
    for pattern in wanted:
        found = (
            [pattern] if trial.has_tensor(pattern) else [n for n in names if re.search(pattern, n)]
        )
        out += [n for n in found if n not in out]
    return out


def format_statistic(value: Any, digits: int = 5) -> str:
    """How a statistic prints in a table: ``-`` when missing, floats with ``digits`` significant
    digits, anything else as ``str``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)
