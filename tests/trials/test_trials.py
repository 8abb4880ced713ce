"""The reader: live trials, index-driven reads, waits that end, and damaged files."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import mltrace.pytorch as smd
from mltrace.exceptions import (
    CorruptRecordError,
    MissingCollectionFiles,
    MltraceValueError,
    NoMoreData,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from mltrace.modes import ModeKeys
from mltrace.trials import StepState, create_trial
from mltrace.trials.tensor import Tensor
from tests.support.torch_training import make_model, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHT = "Sequential_0.weight"


def _write_run(path, steps=4, interval=1, close=True):
    model = make_model()
    hook = smd.Hook(out_dir=str(path), save_config=smd.SaveConfig(save_interval=interval),
                    include_collections=["weights", "gradients"])
    hook.register_module(model)
    captured = train(model, hook, steps)
    if close:
        hook.close()
    return hook, captured


def test_queries_by_regex_collection_and_step(tmp_path):
    _write_run(tmp_path / "run", steps=5, interval=2)
    trial = create_trial(out_dir=str(tmp_path / "run"))
    assert trial.tensor_names(regex="^gradient") == [n for n in trial.tensor_names() if n.startswith("gradient")]
    assert trial.tensor_names(regex=["0.bias$", "2.weight$"]) == [
        "Sequential_2.weight", "gradient/Sequential_0.bias", "gradient/Sequential_2.weight"]
    tensors = trial.tensors_in_collection("weights")
    assert all(isinstance(t, Tensor) for t in tensors)
    assert [t.name for t in tensors] == ["Sequential_0.weight", "Sequential_2.weight"]
    assert trial.tensor_names(step=3) == []
    assert len(trial.tensor_names(step=2)) == 6
    with pytest.raises(MltraceValueError):
        trial.tensor_names(regex="a", collection="weights")
    with pytest.raises(TensorUnavailable):
        trial.tensor("nope")
    assert trial.has_passed_step(2) is StepState.AVAILABLE
    assert trial.has_passed_step(3) is StepState.UNAVAILABLE
    assert trial.has_passed_step(9) is StepState.UNAVAILABLE  # training ended
    with pytest.raises(StepUnavailable):
        trial.tensor(WEIGHT).value(3)
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([10])
    assert trial.modes() == [ModeKeys.GLOBAL]


def test_reading_one_value_reads_one_record(tmp_path):
    _write_run(tmp_path / "run", steps=3)
    trial = create_trial(str(tmp_path / "run"))
    reads = []
    original = trial.storage.read

    def counting(key, start=0, length=None):
        reads.append((key, start, length))
        return original(key, start, length)

    trial.storage.read = counting
    trial.tensor(WEIGHT).value(1)
    assert len(reads) == 1
    key, start, length = reads[0]
    assert key == "events/000000000001/000000000001_worker_0.tfevents" and length is not None
    assert length < os.path.getsize(tmp_path / "run" / key)


LIVE_SCRIPT = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {repo!r})
    import mltrace.pytorch as smd
    from tests.support.torch_training import make_model
    model = make_model()
    hook = smd.Hook(out_dir={out!r}, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    hook.register_module(model)
    for step in range({steps}):
        model(torch.ones(1, 4))
        time.sleep({pause})
    hook.close()
""")


def test_live_trial_follows_training_without_rereading(tmp_path):
    out = str(tmp_path / "live")
    script = LIVE_SCRIPT.format(repo=REPO, out=out, steps=12, pause=0.25)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        trial = create_trial(out, timeout=30)
        index_reads = []
        original = trial.storage.read

        def counting(key, start=0, length=None):
            if key.startswith("index/"):
                index_reads.append(key)
            return original(key, start, length)

        trial.storage.read = counting
        seen = []
        deadline = time.monotonic() + 60
        while not trial.loaded_all_steps and time.monotonic() < deadline:
            seen.append(len(trial.steps()))
            time.sleep(0.1)
        assert trial.loaded_all_steps, "the end marker was never seen"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert trial.steps() == list(range(12))
    assert seen == sorted(seen) and len(set(seen)) > 2, seen  # steps appeared while training ran
    assert len(index_reads) == len(set(index_reads))  # each index file was read once
    trial.wait_for_steps([11])
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([12])


def test_wait_for_steps_on_a_live_run(tmp_path):
    out = str(tmp_path / "live")
    proc = subprocess.Popen([sys.executable, "-c", LIVE_SCRIPT.format(repo=REPO, out=out, steps=6, pause=0.3)])
    try:
        trial = create_trial(out, timeout=30)
        trial.wait_for_steps([4], timeout=30)
        assert trial.has_passed_step(4) is StepState.AVAILABLE
        assert trial.tensor(WEIGHT).value(4).shape == (8, 4)
    finally:
        proc.wait(timeout=30)


def test_create_trial_on_an_empty_location_waits_a_bounded_time(tmp_path):
    start = time.monotonic()
    with pytest.raises(MissingCollectionFiles, match="timeout="):
        create_trial(str(tmp_path / "nothing"), timeout=0.5)
    assert time.monotonic() - start < 5
    (tmp_path / "ended").mkdir()
    (tmp_path / "ended" / "training_job_end.ts").write_bytes(b"")
    start = time.monotonic()
    with pytest.raises(MissingCollectionFiles):
        create_trial(str(tmp_path / "ended"), timeout=30)
    assert time.monotonic() - start < 5  # training ended: no point in waiting


def test_flipped_payload_byte_is_caught_by_the_index_crc(tmp_path):
    _write_run(tmp_path / "run", steps=2)
    path = tmp_path / "run" / "events" / "000000000001" / "000000000001_worker_0.tfevents"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01  # inside the last record's tensor bytes
    path.write_bytes(bytes(data))
    trial = create_trial(str(tmp_path / "run"))
    last = trial.tensor_names(step=1)
    errors = 0
    for name in last:
        try:
            trial.tensor(name).value(1)
        except CorruptRecordError as exc:
            errors += 1
            assert "000000000001_worker_0.tfevents" in str(exc)
    assert errors == 1
    assert trial.tensor(WEIGHT).value(0).shape == (8, 4)  # other steps are unaffected


def test_truncated_and_missing_event_files(tmp_path, caplog):
    _write_run(tmp_path / "run", steps=3)
    ev1 = tmp_path / "run" / "events" / "000000000001" / "000000000001_worker_0.tfevents"
    ev1.write_bytes(ev1.read_bytes()[:40])
    os.remove(tmp_path / "run" / "events" / "000000000002" / "000000000002_worker_0.tfevents")
    trial = create_trial(str(tmp_path / "run"))
    with pytest.raises(CorruptRecordError, match="000000000001_worker_0"):
        for name in trial.tensor_names(step=1):
            trial.tensor(name).value(1)
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        with pytest.raises(TensorUnavailableForStep):
            trial.tensor(WEIGHT).value(2)
    assert any("000000000002_worker_0.tfevents" in r.getMessage() for r in caplog.records)
    assert np.isfinite(trial.tensor(WEIGHT).value(0)).all()


def test_garbage_index_file_skips_its_step_with_a_warning(tmp_path, caplog):
    _write_run(tmp_path / "run", steps=3)
    (tmp_path / "run" / "index" / "000000000" / "000000000001_worker_0.json").write_text("{not json")
    (tmp_path / "run" / "index" / "000000000" / "000000000002_worker_0.json").write_text("")
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0]
    assert len(trial.skipped_files) == 2
    assert any("000000000001_worker_0.json" in r.getMessage() for r in caplog.records)


def test_damaged_collections_file_names_the_file(tmp_path):
    _write_run(tmp_path / "run", steps=1)
    coll = tmp_path / "run" / "collections" / "000000000" / "worker_0_collections.json"
    coll.write_text('{"collections": 3}')
    with pytest.raises(MltraceValueError, match="worker_0_collections.json"):
        create_trial(str(tmp_path / "run"))


def test_range_steps_limits_what_is_loaded(tmp_path):
    _write_run(tmp_path / "run", steps=6)
    trial = create_trial(str(tmp_path / "run"), range_steps=(2, 4))
    assert trial.steps() == [2, 3]


def test_import_leaves_frameworks_out():
    code = ("import sys, mltrace, mltrace.trials\n"
            "heavy = ['torch', 'tensorflow', 'mxnet', 'xgboost', 'tensorboard', 'mlflow', 'boto3']\n"
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_info_summarises_a_trial(tmp_path):
    _write_run(tmp_path / "run", steps=3)
    out = subprocess.run([sys.executable, "-m", "mltrace.cli", "info", str(tmp_path / "run")],
                         capture_output=True, text=True, check=True).stdout
    assert "GLOBAL: 3 steps (0..2)" in out and "gradient/Sequential_0.weight: 3 steps" in out
    bad = subprocess.run([sys.executable, "-m", "mltrace.cli", "info", str(tmp_path / "none"),
                          "--timeout", "0.2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no trial data" in bad.stderr


def test_opening_a_trial_pauses_the_garbage_collector_and_gives_it_back(tmp_path, monkeypatch):
    """Ingesting index files makes a location object per record and no cycle: the cyclic
    collector is paused meanwhile (half the time of opening a 1M-record trial was its walks over
    them) and left as it was found, also when an index file is damaged."""
    import gc

    from mltrace.format import paths
    from mltrace.trials.index import TrialIndex
    from tests.support.rule_trials import write_trial

    write_trial(tmp_path / "t", {s: {"loss": float(s)} for s in range(3)})
    damaged = tmp_path / "t" / paths.index_file_key(3, "worker_0")
    damaged.parent.mkdir(parents=True, exist_ok=True)
    damaged.write_bytes(b'{"meta": {"mode": "TRAIN", "mode_step": ')  # cut off: skipped
    seen: list[bool] = []
    real = TrialIndex.ingest
    monkeypatch.setattr(TrialIndex, "ingest", lambda self, *a: seen.append(gc.isenabled()) or real(self, *a))
    assert gc.isenabled()
    trial = create_trial(str(tmp_path / "t"))
    assert seen == [False, False, False] and gc.isenabled() and trial.steps() == [0, 1, 2]
    assert trial.skipped_files == [paths.index_file_key(3, "worker_0")]
    gc.disable()
    try:
        create_trial(str(tmp_path / "t"))
        assert not gc.isenabled()  # a user's choice is kept
    finally:
        gc.enable()
