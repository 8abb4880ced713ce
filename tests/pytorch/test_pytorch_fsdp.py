"""FSDP2 (``fully_shard``) with gloo on CPU, 2 and 4 processes: weights, biases and gradients of
sharded parameters are saved whole, under the single-process names and shapes, and equal the
values of the same training in one process; reductions-only configurations give the same
reductions without gathering any tensor. The jobs are tests/support/fsdp_training.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from mltrace.trials import create_trial
from tests.support.ddp_training import launch_ranks

pytest.importorskip("torch.distributed.fsdp")
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "fsdp_training.py")
pytestmark = pytest.mark.slow


def _run(out: Path, world: int, *flags: str) -> None:
    if world == 0:
        launch_ranks(lambda rank: [sys.executable, SCRIPT, str(out), "--single", *flags], 1,
                     str(out) + "-logs")
    else:
        launch_ranks(lambda rank: [sys.executable, SCRIPT, str(out), *flags], world,
                     str(out) + "-logs", timeout=180)


def _by_name(out: Path) -> dict[str, dict[int, np.ndarray]]:
    trial = create_trial(str(out))
    return {name: {s: trial.tensor(name).value(s) for s in trial.tensor(name).steps()}
            for name in trial.tensor_names()}


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fsdp-single")
    _run(base / "raw", 0)
    _run(base / "reductions", 0, "--reductions-only")
    return {"raw": base / "raw", "reductions": base / "reductions"}


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_saves_full_tensors_equal_to_one_process(tmp_path: Path, single: dict[str, Path],
                                                       world: int) -> None:
    _run(tmp_path, world)
    trial = create_trial(str(tmp_path))
    assert trial.workers() == ["worker_0"]  # include_workers="one": rank 0 writes
    got, want = _by_name(tmp_path), _by_name(single["raw"])
    params = [n for n in want if not n.startswith("MSELoss")]
    assert "gradient/Sequential_4.weight" in params and "Sequential_2.bias" in params
    assert sorted(got) == sorted(want)
    for name in params:
        for step, value in want[name].items():
            assert got[name][step].shape == value.shape, (name, step)
            np.testing.assert_allclose(got[name][step], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} step {step}")


def test_fsdp2_with_all_workers_each_worker_writes_the_full_tensors(
        tmp_path: Path, single: dict[str, Path]) -> None:
    _run(tmp_path, 2, "--include-workers", "all")
    trial = create_trial(str(tmp_path))
    assert trial.workers() == ["worker_0", "worker_1"]
    want = _by_name(single["raw"])
    for name in ("Sequential_4.weight", "gradient/Sequential_2.weight"):
        for worker in trial.workers():
            for step, value in want[name].items():
                got = trial.tensor(name).value(step, worker=worker)
                np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} step {step} {worker}")


REDUCTIONS = [("mean", False), ("max", False), ("min", False), ("std", False), ("max", True),
              ("l2", False)]


def _reductions(out: Path) -> dict[tuple[str, int, str, bool], float]:
    trial = create_trial(str(out))
    return {(name, step, red, abs_): float(trial.tensor(name).reduction_value(step, red, abs=abs_))
            for name in trial.tensor_names() if not name.startswith("MSELoss")
            for step in trial.tensor(name).steps() for red, abs_ in REDUCTIONS}


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_reductions_only_combine_the_shards_exactly(tmp_path: Path, single: dict[str, Path],
                                                          world: int) -> None:
    _run(tmp_path, world, "--reductions-only")
    got, want = _reductions(tmp_path), _reductions(single["reductions"])
    assert sorted(got) == sorted(want)
    assert ("gradient/Sequential_4.weight", 2, "l2", False) in want
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=str(key))


def test_fsdp2_reductions_of_a_step_share_a_few_all_reduces(tmp_path: Path) -> None:
    """The reductions of every sharded weight and gradient of a step (12 tensors, 6 asked-for
    reductions each) are combined together at the optimizer step: one SUM, one MIN and the
    second SUM of std per step on every rank, not a few per tensor."""
    _run(tmp_path, 2, "--reductions-only")
    names = create_trial(str(tmp_path)).tensor_names()
    assert len([n for n in names if not n.startswith("MSELoss")]) == 12
    for rank in range(2):
        per_step = json.loads((tmp_path.parent / f"{tmp_path.name}-collectives" / f"rank{rank}.json").read_text())
        assert per_step == [3] * len(per_step), (rank, per_step)


def test_fsdp2_stability_signals_equal_one_process(tmp_path: Path) -> None:
    """Grad norms, updates and Adam's state of sharded parameters are combined from the local
    shards (sums and maxima all-reduced, nothing gathered) and equal the one-process values to
    1e-6 relative: the Linear of 1 output row leaves one of the 2 ranks with an empty shard."""
    _run(tmp_path / "single", 0, "--stability")
    _run(tmp_path / "fsdp", 2, "--stability")
    got, want = _by_name(tmp_path / "fsdp"), _by_name(tmp_path / "single")
    signals = [n for n in want if not n.startswith("MSELoss")]
    assert "grad_norm/Sequential" in signals and "optimizer_state/Sequential_4.weight/eps_fraction" in signals
    assert "updates/Sequential_4.bias/ratio" in signals
    assert sorted(got) == sorted(want)
    for name in signals:
        for step, value in want[name].items():
            np.testing.assert_allclose(got[name][step], value, rtol=1e-6, atol=1e-12,
                                       err_msg=f"{name} step {step}")
