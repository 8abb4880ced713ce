"""smdebug 1.0.34's analysis behaviours that an analysis script ported with one sed relies on
(issue 18): analysis-side collections, ``mltrace.analysis.utils.no_refresh``/``refresh``,
``LocalTrial``/``S3Trial``, and ``last_index_token``/``has_passed_step`` in smdebug's own scenarios
(the expected values are those of smdebug's tests/analysis/trials/test_has_passed_step_scenarios.py;
tests/legacy/test_smdebug_porting_analysis.py asks real smdebug the same questions)."""

from __future__ import annotations

import logging
import os
import uuid

import numpy as np
import pytest

from mltrace.analysis.utils import no_refresh, refresh
from mltrace.collections import Collection, CollectionManager
from mltrace.exceptions import MltraceTypeError, MltraceValueError, StepNotYetAvailable
from mltrace.modes import ModeKeys
from mltrace.rules import rule as rule_module
from mltrace.storage import open_storage
from mltrace.trials import LocalTrial, S3Trial, Trial, create_trial
from mltrace.writer import TrialWriter
from tests.support.porting_trials import SCENARIOS, N, three, write_scenario
from tests.support.rule_trials import write_trial

# -- analysis-side collections (smdebug's tests/analysis/trials/test_tensors_api.py) ------------


def _foo_boo_trial(path) -> str:
    steps = {i: {f"foo_{k}": np.ones((3, 3, 3)) for k in range(10)} for i in range(20)}
    steps.update({i: {f"boo_{k}": np.ones((3, 3, 3)) for k in range(10)} for i in range(20, 40)})
    return write_trial(path, steps)


def test_a_collection_the_trial_lacks_is_created_for_the_analysis(tmp_path, caplog):
    tr = create_trial(_foo_boo_trial(tmp_path / "test"))
    tr.collection("test").include("foo")
    tr.collection("test").add_tensor_name("boo_5")
    tr.collection("test").add_tensor_name("boo_6")
    tr.collection("test").add_tensor_name("boo_17")  # a name the trial does not hold
    assert len(tr.tensor_names()) == 20
    assert len(tr.tensor_names(regex="foo")) == 10
    assert len(tr.tensor_names(collection="test")) == 12
    assert len(tr.tensor_names(collection=tr.collection("test"))) == 12
    assert "test" in tr.collections()
    with pytest.raises(ValueError, match="not both"):
        tr.tensor_names(collection=tr.collection("test"), regex="a")
    with pytest.raises(TypeError, match="collection name"):
        tr.tensor_names(collection=5)
    # lives in this Trial object only: the trial's collections file is unchanged
    assert "test" not in create_trial(str(tmp_path / "test")).collections()


def test_a_misspelt_collection_warns_with_the_written_one(tmp_path, caplog):
    path = write_trial(tmp_path / "run", {0: {"loss": 0.5}}, collections={"losses": ["loss"]})
    tr = create_trial(path)
    assert tr.tensor_names(collection="losses") == ["loss"]
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        assert tr.tensor_names(collection="loses") == []
    assert "did you mean 'losses'?" in caplog.text and "'loses'" in caplog.text
    caplog.clear()
    tr.collection("mine").include("^fc")  # filled by the analysis, matching nothing
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        assert tr.tensor_names(collection="mine") == []
    assert "'mine'" in caplog.text and "^fc" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mltrace"):  # views probing a collection
        assert tr.tensor_names(collection="weights") == []
        assert tr.tensor_names(collection="gradients") == []
    assert caplog.text == ""


# -- no_refresh / refresh at smdebug's place ------------------------------------------------


def _live_writer(path) -> TrialWriter:
    writer = TrialWriter(open_storage(str(path)), "worker_0")
    manager = CollectionManager()
    manager.add(Collection("default"))
    writer.write_collections(manager.to_json())
    return writer


def _write_step(writer: TrialWriter, step: int) -> None:
    writer.open_step(step, ModeKeys.TRAIN, step)
    writer.add_tensor("loss", np.array(float(step)), ModeKeys.TRAIN, step)
    writer.close_step()
    writer.flush()


def test_no_refresh_holds_a_live_trial_still_and_refresh_lets_it_look(tmp_path):
    writer = _live_writer(tmp_path / "run")
    _write_step(writer, 0)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0]
    with no_refresh(trial) as held:
        assert held is trial and trial.dynamic_refresh is False
        _write_step(writer, 1)
        assert trial.steps() == [0]
        with refresh([trial]) as again:
            assert again == [trial]
            assert trial.steps() == [0, 1]
        assert trial.dynamic_refresh is False  # back to the outer block's setting
        _write_step(writer, 2)
        assert trial.steps() == [0, 1]
    assert trial.dynamic_refresh is True
    assert trial.steps() == [0, 1, 2]
    writer.close()


def test_no_refresh_does_not_read_a_step_written_while_it_holds(tmp_path):
    """smdebug's "do not look for new data": reading a tensor at a step a writer added after the
    last refresh raises StepNotYetAvailable inside the block (no refresh on a miss), and reads
    once the block is left; steps read before it stay readable inside it."""
    writer = _live_writer(tmp_path / "run")
    _write_step(writer, 0)
    trial = create_trial(str(tmp_path / "run"))
    loss = trial.tensor("loss")
    with no_refresh(trial):
        _write_step(writer, 1)
        for read in (lambda: loss.value(1), lambda: loss.reduction_value(1, "max"),
                     lambda: loss.shape(1), lambda: loss.value(1, mode=ModeKeys.TRAIN)):
            with pytest.raises(StepNotYetAvailable):
                read()
        assert float(loss.value(0)) == 0.0
        assert trial.steps() == [0]
    assert float(loss.value(1)) == 1.0
    with no_refresh(trial):
        _write_step(writer, 2)
        with pytest.raises(StepNotYetAvailable):
            loss.value(2)
    assert trial.steps() == [0, 1, 2] and float(loss.value(2)) == 2.0
    writer.close()


def test_no_refresh_takes_a_list_restores_on_error_and_names_bad_input(tmp_path):
    a = create_trial(write_trial(tmp_path / "a", {0: {"x": 1.0}}))
    b = create_trial(write_trial(tmp_path / "b", {0: {"x": 1.0}}))
    b.dynamic_refresh = False
    with pytest.raises(RuntimeError), no_refresh([a, b]) as both:
        assert both == [a, b] and not a.dynamic_refresh and not b.dynamic_refresh
        raise RuntimeError("a failing rule")
    assert a.dynamic_refresh is True and b.dynamic_refresh is False
    with pytest.raises(MltraceTypeError, match="a trial or a list of trials"):
        with no_refresh("/tmp/run"):
            pass
    # the rules' import keeps working: the same function
    assert rule_module.no_refresh is no_refresh


# -- LocalTrial and S3Trial ---------------------------------------------------------------------


def test_create_trial_returns_local_trials_with_smdebugs_signature(tmp_path):
    path = write_trial(tmp_path / "run", {0: {"x": 1.0}, 1: {"x": 2.0}})
    trial = create_trial(path)
    assert type(trial) is LocalTrial and isinstance(trial, Trial)
    direct = LocalTrial("mine", path, range_steps=(1, None), check=True)
    assert direct.name == "mine" and direct.trial_dir == path and direct.steps() == [1]
    with pytest.raises(MltraceValueError, match="S3Trial"):
        LocalTrial("x", "s3://bucket/run")


def test_s3_trials_with_smdebugs_signature_and_token(s3_server, tmp_path, monkeypatch):
    for name, value in (("AWS_ENDPOINT_URL", s3_server.endpoint),
                        ("AWS_ACCESS_KEY_ID", s3_server.access_key),
                        ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key),
                        ("AWS_DEFAULT_REGION", "us-east-1"),
                        ("MLTRACE_SPILL_DIR", str(tmp_path / "spill"))):
        monkeypatch.setenv(name, value)
    bucket = f"t{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    uri = write_trial(f"s3://{bucket}/jobs/run", {0: {"x": 1.0}, 1: {"x": 2.0}})
    trial = create_trial(uri)
    assert type(trial) is S3Trial and trial.path == uri and trial.name == "run"
    assert (trial.bucket_name, trial.prefix_name) == (bucket, "jobs/run/")
    assert trial.last_index_token == "jobs/run/index/000000000/000000000001_worker_0.json"
    direct = S3Trial("mine", bucket, "jobs/run")
    assert direct.steps() == [0, 1] and direct.tensor("x").value(1) == 2.0
    with pytest.raises(MltraceValueError, match="bucket name"):
        S3Trial("x", f"{bucket}/jobs", "run")


# -- has_passed_step and last_index_token in smdebug's scenarios --------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_has_passed_step_and_last_index_token_as_smdebugs_tests(tmp_path, name):
    workers, ended, modes, all_steps, complete, last_complete, token, states = SCENARIOS[name]
    path = write_scenario(tmp_path / name, workers, ended, modes)
    trial = create_trial(path)
    assert len(trial.workers()) == len(workers)
    assert trial.loaded_all_steps is ended
    assert trial.steps(show_incomplete_steps=True) == all_steps
    assert trial.steps() == complete
    assert trial.last_complete_step == last_complete
    step, worker = token
    assert trial.last_index_token == os.path.join(
        path, "index", "000000000", f"{step:012d}_{worker}.json")
    for (step, mode), state in states.items():
        assert trial.has_passed_step(step, mode=ModeKeys[mode]) is state, (step, mode)


def test_last_index_token_is_none_before_a_step_is_complete(tmp_path):
    path = write_scenario(tmp_path / "run", three({0: "ac"}), False)
    trial = create_trial(path)
    assert trial.last_index_token is None and trial.last_complete_step == -1
    assert trial.has_passed_step(0) is N
