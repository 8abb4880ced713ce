"""A flight recorder dump on the MLflow training run: the sink's ``flight_recorder_dumped`` tags
the run (first non-finite tensor, dump count, last trigger) from its background thread, never
raises into training, and the run's summary shows the first non-finite tensor and the dumps.

The hook's own recorder calls ``flight_recorder_dumped``; here the test calls it on the sink of a
real hook, with record files written into the hook's trial as the recorder writes them."""

from __future__ import annotations

import json
import logging
import time

import mlflow
import pytest
from mlflow import MlflowClient

from mltrace.format.flight_record import Dump, FirstNonFinite, FlightRecord, record_key
from mltrace.trials import create_trial
from mltrace_mlflow import _keys
from mltrace_mlflow.sink import NullSink
from tests.support.mlflow_env import train

POISONED = "Sequential_1_output_0"


def _first(step: int = 3) -> FirstNonFinite:
    return FirstNonFinite(tensor=POISONED, step=step, mode="TRAIN", mode_step=step,
                          worker="worker_0", phase="forward", position=2,
                          nonfinite_tensors=[POISONED, "MSELoss_output_0"])


def _dump(trigger: str, step: int, first: FirstNonFinite | None) -> Dump:
    return Dump(trigger=trigger, reason=f"{trigger} at step {step}", step=step, mode="TRAIN",
                mode_step=step, time=time.time(), steps_before=list(range(max(0, step - 2), step)),
                steps_after=[step + 1], first_nonfinite=first)


def _record_dumps(hook, *dumps: Dump) -> FlightRecord:
    """Write the worker's record as the recorder does, and tell the sink of each dump."""
    record = FlightRecord("worker_0")
    for dump in dumps:
        record.dumps.append(dump)
        if record.first_nonfinite is None:
            record.first_nonfinite = dump.first_nonfinite
        hook.storage.write(record_key("worker_0"), record.to_json())
        hook.sinks[0].flight_recorder_dumped(record, dump)
    return record


def _tag_eventually(client, run_id: str, key: str, timeout: float = 20.0) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = client.get_run(run_id).data.tags.get(key)
        if value is not None:
            return value
        time.sleep(0.1)
    return None


def test_dump_tags_the_training_run_and_the_summary_shows_it(tracking, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=5, close=False, mlflow={"flush_interval": 0.2})
    run_id = hook.sinks[0].run_id
    client = MlflowClient()
    t0 = time.monotonic()
    _record_dumps(hook, _dump("nonfinite", 3, _first()))
    assert time.monotonic() - t0 < 0.5  # handed to the sink's thread, not logged here
    # set by the background thread while training goes on, not only at close
    assert _tag_eventually(client, run_id, _keys.TAG_FIRST_NONFINITE_TENSOR) == POISONED
    tags = client.get_run(run_id).data.tags
    assert tags[_keys.TAG_FIRST_NONFINITE_STEP] == "3"
    assert tags[_keys.TAG_FLIGHT_RECORDER_DUMPS] == "1"
    assert tags[_keys.TAG_FLIGHT_RECORDER_LAST_TRIGGER] == "nonfinite"
    # a second dump, by hand and without a non-finite value of its own: the first one stays
    record = FlightRecord.from_json(hook.storage.read(record_key("worker_0")))
    record.dumps.append(_dump("manual", 4, None))
    hook.storage.write(record_key("worker_0"), record.to_json())
    hook.sinks[0].flight_recorder_dumped(record, record.dumps[-1])
    hook.close()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags[_keys.TAG_FLIGHT_RECORDER_DUMPS] == "2"
    assert tags[_keys.TAG_FLIGHT_RECORDER_LAST_TRIGGER] == "manual"
    assert tags[_keys.TAG_FLIGHT_RECORDER_LAST_REASON] == "manual at step 4"
    assert (tags[_keys.TAG_FIRST_NONFINITE_TENSOR], tags[_keys.TAG_FIRST_NONFINITE_STEP]) == (
        POISONED, "3")
    found = mlflow.search_runs(filter_string=f"tags.`{_keys.TAG_FIRST_NONFINITE_TENSOR}` = '{POISONED}'",
                               search_all_experiments=True, output_format="list")
    assert [r.info.run_id for r in found] == [run_id]
    # the summary: the first non-finite tensor first, then the dumps
    local = client.download_artifacts(run_id, "mltrace", str(tmp_path / "dl"))
    summary = json.load(open(f"{local}/summary.json"))
    assert summary["flight_recorder"]["first_nonfinite"]["tensor"] == POISONED
    assert [(d["trigger"], d["step"]) for d in summary["flight_recorder"]["dumps"]] == [
        ("nonfinite", 3), ("manual", 4)]
    html = open(f"{local}/summary.html").read()
    assert f"First non-finite tensor: <code>{POISONED}</code> at global step 3" in html
    assert "<td>manual at step 4</td>" in html
    assert create_trial(str(tmp_path / "trial")).first_nonfinite() == _first()


def test_a_real_nan_tags_the_run_with_the_poisoned_tensor(tracking, tmp_path):
    """End to end: the hook's own recorder sees fc2's NaN output and tells its MLflow sink."""
    from tests.support.flight_training import POISONED as FC2
    from tests.support.flight_training import train as train_nan

    out = str(tmp_path / "nan")
    train_nan(out, steps=40, poison_step=25, mlflow={"experiment": "nan", "flush_interval": 0.2})
    run = mlflow.search_runs(experiment_names=["nan"], output_format="list")[0]
    tags = run.data.tags
    assert (tags[_keys.TAG_FIRST_NONFINITE_TENSOR], tags[_keys.TAG_FIRST_NONFINITE_STEP]) == (FC2, "25")
    assert tags[_keys.TAG_FLIGHT_RECORDER_DUMPS] == "1"
    assert tags[_keys.TAG_FLIGHT_RECORDER_LAST_TRIGGER] == "nonfinite"
    assert create_trial(out).first_nonfinite().tensor == FC2
    note = tags["mlflow.note.content"]  # the run's description leads with it
    assert f"**First non-finite tensor: `{FC2}` at global step 25** (flight recorder)" in note


def test_a_run_without_dumps_has_no_flight_recorder_tags_or_section(tracking, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=2)
    run_id = hook.sinks[0].run_id
    tags = MlflowClient().get_run(run_id).data.tags
    assert not [k for k in tags if "first_nonfinite" in k or "flight_recorder" in k]
    html = mlflow.artifacts.load_text(f"runs:/{run_id}/mltrace/summary.html")
    assert "Flight recorder" not in html


def test_tagging_failures_never_reach_training(tracking, tmp_path, monkeypatch, caplog):
    hook, _ = train(tmp_path / "trial", steps=2, close=False, mlflow={"flush_interval": 0.1})
    sink = hook.sinks[0]

    def broken(*args, **kwargs):
        raise ConnectionError("tracking server gone")

    monkeypatch.setattr(sink.client, "log_batch", broken)
    with caplog.at_level(logging.WARNING, logger="mltrace_mlflow"):
        _record_dumps(hook, _dump("nonfinite", 1, _first(1)))  # returns at once, raises nothing
        sink.flight_recorder_dumped(None, None)  # not a record at all: logged, not raised
        hook.close()
    assert any("could not tag MLflow run" in r.getMessage() and "tracking server gone" in r.getMessage()
               for r in caplog.records)
    assert "flight recorder dump not tagged" in caplog.text
    assert create_trial(str(tmp_path / "trial")).first_nonfinite() == _first(1)  # the trial has it


def test_workers_that_do_not_log_ignore_dumps():
    NullSink().flight_recorder_dumped(FlightRecord("worker_1"), _dump("rule", 2, None))


@pytest.mark.server
def test_dump_tags_through_a_tracking_server(server, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=3, close=False,
                    mlflow={"experiment": "flight-recorder", "flush_interval": 0.2})
    run_id = hook.sinks[0].run_id
    _record_dumps(hook, _dump("loss_spike", 2, None), _dump("nonfinite", 3, _first()))
    hook.close()
    tags = MlflowClient(server.uri).get_run(run_id).data.tags
    assert tags[_keys.TAG_FLIGHT_RECORDER_DUMPS] == "2"
    assert tags[_keys.TAG_FLIGHT_RECORDER_LAST_TRIGGER] == "nonfinite"
    assert tags[_keys.TAG_FIRST_NONFINITE_TENSOR] == POISONED
