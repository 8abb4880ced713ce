"""Multi-worker trials: torch.distributed jobs (gloo, DistributedDataParallel, 2 and 4 processes on
this machine) write with include_workers "all" and "one" to a local directory and to S3, and the
reader gives each worker's values, ``workers()``, ``num_workers`` and smdebug's step completeness.

The jobs are tests/support/ddp_training.py: each rank trains on data of its own and records what it
computed, so values read back per worker are compared with what that worker saw.
"""

from __future__ import annotations

import json
import os
import sys
import types
import uuid

import numpy as np
import pytest

from mltrace.collections import CollectionManager
from mltrace.exceptions import StepNotYetAvailable
from mltrace.format import paths
from mltrace.modes import ModeKeys
from mltrace.storage import open_storage
from mltrace.trials import StepState, create_trial
from mltrace.writer import TrialWriter
from tests.support.ddp_training import REPO, ROOT, WorkerCapture, run_job

PARAMS = [f"{ROOT}_fc1.weight", f"{ROOT}_fc1.bias", f"{ROOT}_fc2.weight", f"{ROOT}_fc2.bias"]
GRADS = [f"gradient/{p}" for p in PARAMS]
LOSS, INPUT = "MSELoss_output_0", f"{ROOT}_input_0"


def _check_trial(trial, captures: list[WorkerCapture], steps: int) -> None:
    """workers, num_workers, complete steps, and every worker's values as that worker saw them."""
    workers = [f"worker_{r}" for r in range(len(captures))]
    assert [c.worker for c in captures] == workers
    assert all(c.num_workers == len(captures) for c in captures)
    assert trial.workers() == workers and trial.num_workers == len(captures)
    assert trial.loaded_all_steps and trial.steps() == list(range(steps))
    assert trial.last_complete_step == steps - 1
    names = sorted({k.split("|")[0] for c in captures for k in c.values
                    if not k.startswith("averaged|")})
    assert trial.tensor_names() == names
    for name in names:
        tensor = trial.tensor(name)
        assert tensor.steps() == list(range(steps)), name
        for c in captures:
            per_step = tensor.values(worker=c.worker)
            for step in range(steps):
                want = c.get(name, step)
                assert tensor.workers(step) == workers, (name, step)
                got = tensor.value(step, worker=c.worker)
                assert np.array_equal(got, want), (name, step, c.worker)
                assert np.array_equal(per_step[step], want), (name, step, c.worker)
                assert trial.has_passed_step(step) is StepState.AVAILABLE
        # With no worker named, a value is the first worker's (smdebug's choice).
        assert np.array_equal(tensor.value(0), captures[0].get(name, 0))


def _check_what_differs(captures: list[WorkerCapture], steps: int) -> None:
    """The workers saw different data: weights agree (DDP), inputs, losses, gradients differ."""
    first = captures[0]
    for other in captures[1:]:
        for step in range(steps):
            for name in PARAMS:
                assert np.array_equal(first.get(name, step), other.get(name, step)), name
            for name in (INPUT, LOSS, GRADS[0]):
                assert not np.array_equal(first.get(name, step), other.get(name, step)), name
            # DDP averages gradients after the hook saw them: the average is equal everywhere.
            assert np.array_equal(first.averaged_gradient(GRADS[0], step),
                                  other.averaged_gradient(GRADS[0], step))
    mean = np.mean([c.get(GRADS[0], 0) for c in captures], axis=0)
    assert np.allclose(first.averaged_gradient(GRADS[0], 0), mean, atol=1e-6)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp2")
    out = str(root / "run")
    return out, run_job(out, str(root / "capture"), world_size=2, steps=3)


def test_every_worker_writes_its_own_files(two_workers):
    out, _ = two_workers
    for worker in ("worker_0", "worker_1"):
        with open(os.path.join(out, paths.collections_file_key(worker))) as f:
            assert json.load(f)["_meta"] == {"num_workers": 2}
        for step in range(3):
            assert os.path.isfile(os.path.join(out, paths.event_file_key(step, worker)))
            assert os.path.isfile(os.path.join(out, paths.index_file_key(step, worker)))
        assert os.path.isfile(os.path.join(out, paths.WORKERS_DONE_DIR, worker))
    assert os.path.isfile(os.path.join(out, paths.END_OF_JOB_MARKER))


def test_two_workers_read_back_per_worker(two_workers):
    out, captures = two_workers
    _check_what_differs(captures, 3)
    _check_trial(create_trial(out), captures, 3)


def test_four_workers_read_back_per_worker(tmp_path):
    out = str(tmp_path / "run")
    captures = run_job(out, str(tmp_path / "capture"), world_size=4, steps=2)
    _check_what_differs(captures, 2)
    trial = create_trial(out)
    _check_trial(trial, captures, 2)
    assert sorted(os.listdir(os.path.join(out, paths.COLLECTIONS_DIR))) == [
        f"worker_{r}_collections.json" for r in range(4)]


def test_include_workers_one_writes_only_the_chief(tmp_path):
    out = str(tmp_path / "run")
    captures = run_job(out, str(tmp_path / "capture"), world_size=2, steps=2, include_workers="one")
    collections = sorted(os.listdir(os.path.join(out, paths.COLLECTIONS_DIR)))
    assert collections == ["worker_0_collections.json"]
    with open(os.path.join(out, paths.collections_file_key("worker_0"))) as f:
        assert json.load(f)["_meta"] == {"num_workers": 1}
    written = [f for _, _, files in os.walk(out) for f in files]
    assert not [f for f in written if "worker_1" in f], written
    trial = create_trial(out)
    assert trial.workers() == ["worker_0"] and trial.num_workers == 1
    assert trial.steps() == [0, 1] and trial.loaded_all_steps
    for name in (INPUT, LOSS, *PARAMS, *GRADS):
        for step in (0, 1):
            assert trial.tensor(name).workers(step) == ["worker_0"]
            assert np.array_equal(trial.tensor(name).value(step), captures[0].get(name, step)), name


def test_two_workers_to_s3(s3_server, tmp_path, monkeypatch):
    """Workers write to S3 (the server checks their credentials), the DDP wrapper registered."""
    bucket = f"ddp{uuid.uuid4().hex[:10]}"
    s3_server.client().create_bucket(Bucket=bucket)
    for key, value in (("AWS_ENDPOINT_URL", s3_server.endpoint),
                       ("AWS_ACCESS_KEY_ID", s3_server.access_key),
                       ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key),
                       ("AWS_DEFAULT_REGION", "us-east-1"),
                       ("MLTRACE_SPILL_DIR", str(tmp_path / "spill"))):
        monkeypatch.setenv(key, value)  # the workers inherit them; the reader here uses them too
    uri = f"s3://{bucket}/jobs/ddp"
    captures = run_job(uri, str(tmp_path / "capture"), world_size=2, steps=3, register="ddp")
    assert not (tmp_path / "spill").exists() or not any((tmp_path / "spill").iterdir())
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]}
    for worker in ("worker_0", "worker_1"):
        assert f"jobs/ddp/{paths.collections_file_key(worker)}" in keys
        assert f"jobs/ddp/{paths.index_file_key(2, worker)}" in keys
    trial = create_trial(uri)
    assert "DistributedDataParallel_module.fc1.weight" in trial.tensor_names()
    _check_trial(trial, captures, 3)


# -- completeness across workers, with a lagging worker played by mltrace's writer ----------------

def _collections(num_workers: int) -> str:
    manager = CollectionManager()
    manager.get("default").include("w")
    manager.num_workers = num_workers
    return manager.to_json()


def _write_steps(writer: TrialWriter, steps, value: float) -> None:
    for step in steps:
        writer.open_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("w", np.full(2, value + step, dtype=np.float32), ModeKeys.TRAIN, step)
        writer.close_step()
    writer.flush()


def test_a_step_is_complete_only_when_every_worker_wrote_it(tmp_path):
    storage = open_storage(str(tmp_path / "run"))
    fast, slow = TrialWriter(storage, "worker_0"), TrialWriter(storage, "worker_1")
    for writer in (fast, slow):
        writer.write_collections(_collections(2))
    _write_steps(fast, range(3), 0.0)
    _write_steps(slow, [0], 100.0)

    trial = create_trial(str(tmp_path / "run"))
    assert trial.num_workers == 2 and trial.workers() == ["worker_0", "worker_1"]
    assert trial.steps() == [0] and trial.last_complete_step == 0
    assert trial.steps(show_incomplete_steps=True) == [0, 1, 2]
    assert trial.steps(mode=ModeKeys.TRAIN) == [0]
    assert trial.tensor("w").steps() == [0]
    assert trial.has_passed_step(0) is StepState.AVAILABLE
    assert trial.has_passed_step(1) is StepState.NOT_YET_AVAILABLE
    assert trial.has_passed_step(3) is StepState.NOT_YET_AVAILABLE
    assert trial.tensor("w").workers(1) == ["worker_0"]
    assert not trial.loaded_all_steps
    with pytest.raises(StepNotYetAvailable):
        trial.wait_for_steps([1], timeout=0.3)

    _write_steps(slow, [1], 100.0)  # the slow worker catches up on step 1
    assert trial.steps() == [0, 1] and trial.has_passed_step(2) is StepState.NOT_YET_AVAILABLE
    assert trial.tensor("w").value(1, worker="worker_1")[0] == 101.0

    fast.write_end_marker()  # the fast worker finishes first: training has not ended yet
    fast.close()
    assert storage.exists(paths.END_OF_JOB_MARKER)
    assert trial.steps() == [0, 1] and not trial.loaded_all_steps

    _write_steps(slow, [2], 100.0)
    slow.write_end_marker()
    slow.close()
    assert trial.steps() == [0, 1, 2] and trial.loaded_all_steps
    assert trial.has_passed_step(3) is StepState.UNAVAILABLE
    for step in range(3):
        assert trial.tensor("w").workers(step) == ["worker_0", "worker_1"]
        assert trial.tensor("w").value(step, worker="worker_0")[0] == step
        assert trial.tensor("w").value(step, worker="worker_1")[0] == 100.0 + step


def test_a_worker_that_skips_a_step_does_not_block_later_ones(tmp_path):
    """smdebug's rule: once a later step is complete, an earlier incomplete one counts as done."""
    storage = open_storage(str(tmp_path / "run"))
    w0, w1 = TrialWriter(storage, "worker_0"), TrialWriter(storage, "worker_1")
    for writer in (w0, w1):
        writer.write_collections(_collections(2))
    _write_steps(w0, [0, 1, 2], 0.0)
    _write_steps(w1, [0, 2], 100.0)  # worker_1 saved nothing at step 1
    trial = create_trial(str(tmp_path / "run"))
    assert trial.last_complete_step == 2 and trial.steps() == [0, 1, 2]
    assert trial.tensor("w").workers(1) == ["worker_0"]
    assert trial.has_passed_step(1) is StepState.AVAILABLE
    for writer in (w0, w1):
        writer.close()


def test_a_crashed_worker_holds_steps_back_only_for_the_wait_window(tmp_path, monkeypatch, caplog):
    """smdebug's INCOMPLETE_STEP_WAIT_WINDOW: past that many waiting steps, a live reader stops
    waiting for a worker that stopped writing, and keeps only the newest half waiting."""
    monkeypatch.setenv("SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW", "4")  # smdebug's variable works too
    storage = open_storage(str(tmp_path / "run"))
    alive, crashed = TrialWriter(storage, "worker_0"), TrialWriter(storage, "worker_1")
    for writer in (alive, crashed):
        writer.write_collections(_collections(2))
    _write_steps(crashed, [0], 100.0)
    _write_steps(alive, range(5), 0.0)  # steps 1-4 wait: not more than the window
    trial = create_trial(str(tmp_path / "run"))
    assert trial.incomplete_step_window == 4 and trial.steps() == [0]
    _write_steps(alive, range(5, 10), 0.0)  # 9 steps wait: all but the newest 2 count
    with caplog.at_level("WARNING", logger="mltrace.trials"):
        assert trial.steps() == list(range(8))
    assert "wait for workers ['worker_1']" in caplog.text
    assert trial.has_passed_step(9) is StepState.NOT_YET_AVAILABLE
    assert trial.tensor("w").value(5, worker="worker_0")[0] == 5.0
    monkeypatch.setenv("MLTRACE_INCOMPLETE_STEP_WAIT_WINDOW", "many")
    with pytest.raises(ValueError, match="MLTRACE_INCOMPLETE_STEP_WAIT_WINDOW"):
        create_trial(str(tmp_path / "run"))
    for writer in (alive, crashed):
        writer.close()


def test_horovod_names_the_worker_when_torch_distributed_is_not_initialized(tmp_path, monkeypatch):
    """The Horovod path, with a stand-in for an initialized ``horovod.torch`` (Horovod itself
    cannot be installed here)."""
    import torch

    import mltrace.pytorch as smd

    hvd = types.ModuleType("horovod.torch")
    hvd.is_initialized = lambda: True
    hvd.rank = lambda: 1
    hvd.size = lambda: 3
    monkeypatch.setitem(sys.modules, "horovod.torch", hvd)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_workers="all",
                    save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    model = torch.nn.Linear(2, 1)
    hook.register_module(model)
    model(torch.ones(1, 2))
    hook.close()
    assert (hook.worker, hook.num_workers) == ("worker_1", 3)
    with open(tmp_path / "run" / paths.collections_file_key("worker_1")) as f:
        assert json.load(f)["_meta"] == {"num_workers": 3}
    hvd.is_initialized = lambda: False
    assert smd.Hook(out_dir=str(tmp_path / "other")).adapter.worker_identity() == ("worker_0", 1)


XGB_WORKER = """
import json, sys
import numpy as np
import xgboost as xgb
import mltrace.xgboost as smd

args, out, capture = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
with xgb.collective.CommunicatorContext(**args):
    rng = np.random.default_rng(xgb.collective.get_rank())  # each worker has data of its own
    x = rng.normal(size=(30, 3)).astype(np.float32)
    y = (x[:, 0] - x[:, 1]).astype(np.float32)
    train, val = xgb.DMatrix(x[:20], label=y[:20]), xgb.DMatrix(x[20:], label=y[20:])
    hook = smd.Hook(out_dir=out, include_workers="all", validation_data=val,
                    include_collections=["metrics", "labels"],
                    save_config=smd.SaveConfig(save_interval=1))
    xgb.train({"max_depth": 2, "nthread": 1}, train, num_boost_round=2, evals=[(train, "train")],
              callbacks=[hook])
    hook.close()
    np.savez(f"{capture}_{hook.worker}.npz", labels=y[20:], num_workers=hook.num_workers)
"""


def test_xgboost_collective_names_the_workers(tmp_path):
    """Two XGBoost workers joined by xgboost's own tracker (xgboost.collective) write one trial."""
    import subprocess

    from xgboost.tracker import RabitTracker

    tracker = RabitTracker(host_ip="127.0.0.1", n_workers=2)
    tracker.start()
    out, capture = str(tmp_path / "run"), str(tmp_path / "capture")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-c", XGB_WORKER, json.dumps(tracker.worker_args()), out, capture]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    tracker.wait_for(30)
    trial = create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1"] and trial.num_workers == 2
    assert trial.steps() == [0, 1] and trial.loaded_all_steps
    for worker in trial.workers():
        with np.load(f"{capture}_{worker}.npz") as saw:
            assert int(saw["num_workers"]) == 2
            for step in (0, 1):
                got = trial.tensor("labels").value(step, worker=worker)
                assert np.array_equal(got, saw["labels"])
        assert trial.tensor("train-rmse").workers(1) == ["worker_0", "worker_1"]
    first, second = (trial.tensor("labels").value(0, worker=w) for w in trial.workers())
    assert not np.array_equal(first, second)
