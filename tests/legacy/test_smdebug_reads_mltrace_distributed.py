"""Real smdebug 1.0.34's reader reads a multi-worker trial that mltrace's PyTorch hook wrote.

A 2-process torch.distributed job (gloo, DistributedDataParallel; tests/support/ddp_training.py, run
with this venv's Python) saves with ``include_workers="all"`` to a local directory, each rank
training on data of its own and recording what it computed. smdebug's ``create_trial`` must see
both workers, ``num_workers`` 2, every step complete, and per worker the values that worker saw,
as mltrace's reader does.
"""

from __future__ import annotations

import numpy as np
import pytest
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.core.tensor import StepState as SmdStepState
from smdebug.trials import create_trial as smd_create_trial

from mltrace.trials import StepState
from mltrace.trials import create_trial as ml_create_trial
from tests.support.ddp_training import run_job

STEPS = 3
WORKERS = ["worker_0", "worker_1"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp_smdebug")
    out = str(root / "run")
    captures = run_job(out, str(root / "capture"), world_size=2, steps=STEPS)
    return out, captures, smd_create_trial(out), ml_create_trial(out)


def test_workers_num_workers_and_steps(job):
    _, captures, st, mt = job
    assert [c.worker for c in captures] == WORKERS
    assert st.workers() == mt.workers() == WORKERS
    assert st.num_workers == mt.num_workers == 2
    assert st.steps() == mt.steps() == list(range(STEPS))
    # The job never calls set_mode: every step is a GLOBAL step, for both readers.
    assert st.steps(mode=SmdModeKeys.GLOBAL) == mt.steps(mode="GLOBAL") == list(range(STEPS))
    assert st.steps(mode=SmdModeKeys.TRAIN) == mt.steps(mode="TRAIN") == []
    assert st.loaded_all_steps and mt.loaded_all_steps
    assert st.last_complete_step == mt.last_complete_step == STEPS - 1
    for step in range(STEPS):
        assert st.has_passed_step(step) is SmdStepState.AVAILABLE
        assert mt.has_passed_step(step) is StepState.AVAILABLE


def test_values_per_worker_equal_what_each_worker_saw(job):
    _, captures, st, mt = job
    names = sorted({k.split("|")[0] for c in captures for k in c.values
                    if not k.startswith("averaged|")})
    assert st.tensor_names() == mt.tensor_names() == names
    differ = set()
    for name in names:
        for step in range(STEPS):
            assert sorted(st.tensor(name).workers(step)) == mt.tensor(name).workers(step) == WORKERS
            for c in captures:
                want = c.get(name, step)
                got = st.tensor(name).value(step, worker=c.worker)
                assert got.dtype == want.dtype and np.array_equal(got, want), (name, step, c.worker)
                assert np.array_equal(mt.tensor(name).value(step, worker=c.worker), got)
            if not np.array_equal(captures[0].get(name, step), captures[1].get(name, step)):
                differ.add(name)
    # Per-worker data is really there: inputs, losses and local gradients differ between
    # workers (weights do not: DDP keeps them equal).
    assert {"Net_input_0", "MSELoss_output_0", "gradient/Net_fc1.weight"} <= differ
    assert "Net_fc1.weight" not in differ


def test_values_of_one_worker_over_steps(job):
    _, captures, st, mt = job
    for c in captures:
        smd_values = st.tensor("Net_input_0").values(worker=c.worker)
        ml_values = mt.tensor("Net_input_0").values(worker=c.worker)
        assert sorted(smd_values) == sorted(ml_values) == list(range(STEPS))
        for step in range(STEPS):
            assert np.array_equal(smd_values[step], c.get("Net_input_0", step))
            assert np.array_equal(ml_values[step], c.get("Net_input_0", step))
