"""Write small synthetic trials with mltrace's own writer, for rule tests.

    path = write_trial(tmp_path / "run", {0: {"loss": 0.3}, 4: {"loss": 0.33}},
                       modes={4: "eval"}, collections={"losses": ["loss"]})

Steps are global steps; each one's mode defaults to GLOBAL (mode step = global step). A mode
given without a mode step gets the count of earlier saved steps of that mode. Names made with
``red(name, "nan_count")`` are stored reductions of ``name`` (no raw value needed).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from mltrace.collections import Collection, CollectionManager
from mltrace.modes import ModeKeys, mode_from
from mltrace.reductions import reduction_tensor_name
from mltrace.storage import open_storage
from mltrace.writer import TrialWriter


def red(tensor_name: str, reduction: str, abs: bool = False) -> str:
    """The name under which a stored reduction of ``tensor_name`` is written."""
    return reduction_tensor_name(tensor_name, reduction, abs)


def write_trial(
    path: Any,
    steps: Mapping[int, Mapping[str, Any]],
    *,
    modes: Mapping[int, Any] | None = None,
    collections: Mapping[str, list[str]] | None = None,
    wall_times: Mapping[int, float] | None = None,
    end: bool = True,
    worker: str = "worker_0",
) -> str:
    """Write a trial at ``path`` and return the path as a string.

    Args:
        path: the trial directory.
        steps: {global step: {tensor name: value}} (values become numpy arrays).
        modes: {global step: mode or (mode, mode step)}; missing steps are GLOBAL.
        collections: {collection name: include regexes}; "default" is always there.
        wall_times: {global step: seconds since the epoch} for the step's records.
        end: write the end-of-training marker.
    """
    location = str(path)
    writer = TrialWriter(open_storage(location), worker)
    manager = CollectionManager()
    manager.add(Collection("default"))
    for name, regexes in (collections or {}).items():
        manager.add(Collection(name, include_regex=regexes))
    writer.write_collections(manager.to_json())
    counters: dict[ModeKeys, int] = {}
    for step in sorted(steps):
        mode, mode_step = _mode(step, (modes or {}).get(step), counters)
        wall = (wall_times or {}).get(step, time.time())
        writer.open_step(step, mode, mode_step)
        for name, value in steps[step].items():
            writer.add_tensor(name, np.asarray(value), mode, mode_step, wall_time=wall)
        writer.close_step()
    if end:
        writer.write_end_marker()
    writer.close()
    return location


def _mode(step: int, given: Any, counters: dict[ModeKeys, int]) -> tuple[ModeKeys, int]:
    if given is None:
        return ModeKeys.GLOBAL, step
    if isinstance(given, tuple):
        mode, mode_step = mode_from(given[0]), int(given[1])
    else:
        mode = mode_from(given)
        mode_step = counters.get(mode, 0)
    counters[mode] = mode_step + 1
    return mode, mode_step


def last_step(trial: Any) -> int:
    """The last saved global step of a trial (for invoke_rule's exclusive end_step)."""
    return max(trial.steps())
