"""Trials shaped like smdebug 1.0.34's has_passed_step scenarios
(tests/analysis/trials/test_has_passed_step_scenarios.py), written with mltrace's writer, and
what smdebug's tests expect of each: used by tests/porting/test_porting_analysis.py and, against real
smdebug, by tests/legacy/test_smdebug_porting_analysis.py."""

from __future__ import annotations

import numpy as np

from mltrace.collections import Collection, CollectionManager
from mltrace.modes import ModeKeys
from mltrace.storage import open_storage
from mltrace.trials import StepState
from mltrace.writer import TrialWriter

A, N, U = StepState.AVAILABLE, StepState.NOT_YET_AVAILABLE, StepState.UNAVAILABLE


def write_scenario(path, workers: dict[str, list[int]], ended: bool,
                   modes: dict[int, tuple[str, int]] | None = None) -> str:
    """A trial whose workers each wrote the given global steps ({worker: steps}), modes as
    {global step: (mode, mode step)} (GLOBAL otherwise); every worker marks the end if ``ended``."""
    location = str(path)
    manager = CollectionManager()
    manager.add(Collection("default"))
    manager.num_workers = len(workers)
    for worker, steps in workers.items():
        writer = TrialWriter(open_storage(location), worker)
        writer.write_collections(manager.to_json())
        for step in steps:
            mode, mode_step = (modes or {}).get(step, ("GLOBAL", step))
            writer.open_step(step, ModeKeys[mode], mode_step)
            writer.add_tensor("gradients/dummy:0", np.ones(2), ModeKeys[mode], mode_step)
            writer.close_step()
        if ended:
            writer.write_end_marker()
        writer.close()
    return location


TWO_MODES = {i: ("TRAIN", i) for i in range(0, 31, 10)} | {
    i + 40: ("EVAL", i) for i in range(0, 31, 10)}
ABC = ("worker_0", "worker_1", "worker_2")


def three(per_step: dict[int, str]) -> dict[str, list[int]]:
    """{step: which of a, b, c wrote it} -> {worker: steps}."""
    return {w: [s for s, who in per_step.items() if "abc"[i] in who] for i, w in enumerate(ABC)}


# (workers, ended, modes, expected steps(show_incomplete), steps(), last_complete_step,
#  token step and worker, {(step, mode): state})
SCENARIOS = {
    "single_writer_two_modes_complete": (
        {"worker_0": sorted(TWO_MODES)}, True, TWO_MODES,
        [0, 10, 20, 30, 40, 50, 60, 70], [0, 10, 20, 30, 40, 50, 60, 70], 70, (70, "worker_0"),
        {(30, "GLOBAL"): A, (23, "TRAIN"): U, (40, "TRAIN"): U, (30, "EVAL"): A, (23, "EVAL"): U,
         (80, "GLOBAL"): U, (80, "TRAIN"): U, (80, "EVAL"): U}),
    "single_writer_two_modes_incomplete": (
        {"worker_0": sorted(TWO_MODES)}, False, TWO_MODES,
        [0, 10, 20, 30, 40, 50, 60, 70], [0, 10, 20, 30, 40, 50, 60, 70], 70, (70, "worker_0"),
        {(30, "GLOBAL"): A, (23, "TRAIN"): U, (40, "TRAIN"): N, (30, "EVAL"): A, (23, "EVAL"): U,
         (80, "GLOBAL"): N, (80, "TRAIN"): N, (80, "EVAL"): N}),
    "single_writer_step_missing_complete": (
        {"worker_0": [0, 1, 2, 3, 5, 6]}, True, None, [0, 1, 2, 3, 5, 6], [0, 1, 2, 3, 5, 6], 6,
        (6, "worker_0"), {(3, "GLOBAL"): A, (4, "GLOBAL"): U, (8, "GLOBAL"): U}),
    "single_writer_step_missing_incomplete": (
        {"worker_0": [0, 1, 2, 3, 5, 6]}, False, None, [0, 1, 2, 3, 5, 6], [0, 1, 2, 3, 5, 6], 6,
        (6, "worker_0"), {(3, "GLOBAL"): A, (4, "GLOBAL"): U, (8, "GLOBAL"): N}),
    "three_writers_not_all_steps_incomplete": (
        three({0: "abc", 1: "abc", 2: "abc", 3: "ac", 4: "ac", 5: "ac", 6: "ac"}), False, None,
        [0, 1, 2, 3, 4, 5, 6], [0, 1, 2], 2, (2, "worker_2"),
        {(2, "GLOBAL"): A, (4, "GLOBAL"): N, (6, "GLOBAL"): N, (8, "GLOBAL"): N}),
    "three_writers_not_all_steps_complete": (
        three({0: "abc", 1: "abc", 2: "abc", 3: "ac", 4: "ac", 5: "ac", 6: "ac"}), True, None,
        [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6], 6, (2, "worker_2"),
        {(3, "GLOBAL"): A, (4, "GLOBAL"): A, (6, "GLOBAL"): A, (8, "GLOBAL"): U}),
    "three_writers_later_step_written_incomplete": (
        three({0: "abc", 1: "abc", 2: "abc", 3: "ac", 4: "ac", 5: "ac", 6: "abc"}), False, None,
        [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6], 6, (6, "worker_2"),
        {(2, "GLOBAL"): A, (4, "GLOBAL"): A, (6, "GLOBAL"): A, (8, "GLOBAL"): N}),
    "three_writers_one_step_missing_partially_incomplete": (
        three({0: "abc", 1: "abc", 2: "abc", 4: "ac", 5: "ac", 6: "ac"}), False, None,
        [0, 1, 2, 4, 5, 6], [0, 1, 2], 2, (2, "worker_2"),
        {(2, "GLOBAL"): A, (3, "GLOBAL"): N, (4, "GLOBAL"): N, (6, "GLOBAL"): N,
         (8, "GLOBAL"): N}),
}
