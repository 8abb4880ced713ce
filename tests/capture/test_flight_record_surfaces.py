"""The flight recorder's surfaces outside the capture path: the dump request (rule action, rule
CLI, ``mltrace watch``'s RULES.json, ``mltrace dump``) and the reader API over the record files.

Record files are written with ``FlightRecord(...).to_json()`` into trials made by the usual
helper, so these tests stand apart from the hook's own recorder."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from mltrace import cli
from mltrace.exceptions import MltraceValueError
from mltrace.format import flight_record
from mltrace.format.flight_record import (
    REQUEST_FILE,
    Dump,
    FirstNonFinite,
    FlightRecord,
    read_request,
    record_key,
    write_request,
)
from mltrace.rules.actions import DumpFlightRecorder, parse_actions
from mltrace.rules.rule_invoker import main as rule_main
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from mltrace.watch import parse_watch_rules
from mltrace.watch.executors import LocalPoolExecutor
from mltrace.watch.scheduling import Scheduler
from mltrace.watch.service import Watcher
from tests.support.rule_trials import write_trial

#: A custom rule as the seed documents write it: its constructor takes no action_str.
NO_ACTION_STR_RULE = '''
from mltrace.rules import Rule


class AlwaysFires(Rule):
    def __init__(self, base_trial):
        super().__init__(base_trial, other_trials=None)

    def invoke_at_step(self, step):
        self.last_message = f"fired at {step}"
        return step >= 1
'''


def _zeros(path, end: bool = True) -> str:
    steps = {0: {"w": np.ones(4)}, 1: {"w": np.zeros(4)}}
    return write_trial(path, steps, end=end)


def _request(path) -> dict:
    return json.loads((path / REQUEST_FILE).read_bytes())


def test_request_round_trip_damage_and_bad_arguments(tmp_path, caplog):
    storage = open_storage(str(tmp_path))
    assert read_request(storage) is None
    written = write_request(storage, "loss spiked", rule="LossNotDecreasing", step=12)
    assert len(written.id) == 32 and int(written.id, 16) >= 0 and written.time > 0
    assert read_request(storage) == written
    doc = _request(tmp_path)
    assert doc["reason"] == doc["message"] == "loss spiked"  # reads like the stop signal too
    assert (doc["rule"], doc["step"]) == ("LossNotDecreasing", 12)
    second = write_request(storage, "by hand")
    assert second.id != written.id and read_request(storage) == second
    assert _request(tmp_path)["rule"] is None and _request(tmp_path)["step"] is None
    (tmp_path / REQUEST_FILE).write_bytes(b"{not json")
    with caplog.at_level(logging.WARNING, logger="mltrace.format.flight_record"):
        assert read_request(storage) is None
    assert REQUEST_FILE in caplog.text
    (tmp_path / REQUEST_FILE).write_bytes(b'{"reason": "no id"}')
    assert read_request(storage) is None
    with pytest.raises(TypeError, match="reason=3 must be a string"):
        write_request(storage, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step='7' must be an integer"):
        write_request(storage, "x", step="7")  # type: ignore[arg-type]


def test_rule_cli_action_writes_the_request(tmp_path, capsys):
    path = _zeros(tmp_path / "run", end=False)
    action = '{"name": "DumpFlightRecorder"}'  # case-insensitive, as smdebug's names
    code = rule_main(["--trial-dir", path, "--rule-name", "AllZero", "--tensor_regex", "w",
                      "--threshold", "75", "--action-str", action, "--end-step", "2",
                      "--wait", "5"])
    assert code == 1, capsys.readouterr()
    doc = _request(tmp_path / "run")
    assert doc["rule"] == "AllZero" and doc["step"] == 1 and "w" in doc["message"]
    assert len(doc["id"]) == 32 and doc["time"] > 0
    # both actions at once, as a list
    os.remove(tmp_path / "run" / REQUEST_FILE)
    both = '[{"name": "stoptraining"}, {"name": "dumpflightrecorder"}]'
    assert rule_main(["--trial-dir", path, "--rule-name", "AllZero", "--tensor_regex", "w",
                      "--threshold", "75", "--action-str", both, "--end-step", "2"]) == 1
    assert (tmp_path / "run" / REQUEST_FILE).exists()
    assert (tmp_path / "run" / "mltrace_stop_training.json").exists()


def test_one_request_per_run_of_consecutive_firings(tmp_path, caplog):
    zero, one = np.zeros(4), np.ones(4)
    path = write_trial(tmp_path / "run", {0: {"w": one}, 1: {"w": zero}, 2: {"w": zero},
                                          3: {"w": one}, 4: {"w": zero}})
    with caplog.at_level(logging.WARNING, logger="mltrace.rules.actions"):
        assert rule_main(["--trial-dir", path, "--rule-name", "AllZero", "--tensor_regex", "w",
                          "--threshold", "75", "--action-str",
                          '{"name": "dumpflightrecorder"}']) == 1
    asked = [r.getMessage() for r in caplog.records if "to dump its flight recorder" in r.getMessage()]
    assert [m.split(" fired at step ")[1].split(":")[0] for m in asked] == ["1", "4"]
    assert _request(tmp_path / "run")["step"] == 4


def test_custom_rule_without_action_str_gets_the_cli_actions(tmp_path):
    path = _zeros(tmp_path / "run")
    rule_file = tmp_path / "my_rule.py"
    rule_file.write_text(NO_ACTION_STR_RULE)
    assert rule_main(["--trial-dir", path, "--rule-file", str(rule_file), "--rule-name",
                      "AlwaysFires", "--action-str", '{"name": "dumpflightrecorder"}']) == 1
    doc = _request(tmp_path / "run")
    assert doc["rule"] == "AlwaysFires" and doc["step"] == 1 and doc["reason"] == "fired at 1"


def test_unknown_action_names_the_valid_ones(tmp_path, capsys):
    with pytest.raises(MltraceValueError, match="use stoptraining, dumpflightrecorder or notify"):
        parse_actions('{"name": "dump"}', "MyRule")
    path = _zeros(tmp_path / "run")
    assert rule_main(["--trial-dir", path, "--rule-name", "AllZero", "--tensor_regex", "w",
                      "--action-str", '{"name": "dumpflight"}']) == 2
    assert "unknown action 'dumpflight'" in capsys.readouterr().err


def test_action_that_cannot_write_logs_and_the_verdict_stands(tmp_path, caplog):
    path = _zeros(tmp_path / "run")
    os.mkdir(os.path.join(path, REQUEST_FILE))  # a folder where the file goes: the write fails
    trial = create_trial(path)
    from mltrace.rules.builtin import rule_class

    rule = rule_class("AllZero")(trial, tensor_regex="w", threshold=75)
    with caplog.at_level(logging.ERROR, logger="mltrace.rules.actions"):
        DumpFlightRecorder().invoke(rule, 1)
    assert "could not write the flight recorder request" in caplog.text and path in caplog.text


def test_mltrace_dump_writes_a_person_s_request(tmp_path, capsys):
    live = _zeros(tmp_path / "live", end=False)
    assert cli.main(["dump", live, "--reason", "loss looks odd"]) == 0
    doc = _request(tmp_path / "live")
    assert doc["reason"] == "loss looks odd" and doc["rule"] is None and doc["step"] is None
    assert doc["id"] in capsys.readouterr().out
    assert cli.main(["dump", live]) == 0
    assert _request(tmp_path / "live")["reason"] == "requested with mltrace dump"


@pytest.mark.parametrize("where, message", [
    ("missing", "is not a folder: pass the out_dir of a running hook"),
    ("empty", "holds no trial (no collections file)"),
    ("ended", "has ended (it wrote training_job_end.ts): no hook is left to dump"),
])
def test_mltrace_dump_refuses_what_no_hook_would_read(tmp_path, capsys, where, message):
    (tmp_path / "empty").mkdir()
    _zeros(tmp_path / "ended", end=True)
    assert cli.main(["dump", str(tmp_path / where)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / where / REQUEST_FILE).exists()


def test_mltrace_dump_on_s3(s3_server, tmp_path, monkeypatch, capsys):
    for name, value in (("AWS_ENDPOINT_URL", s3_server.endpoint),
                        ("AWS_ACCESS_KEY_ID", s3_server.access_key),
                        ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    s3_server.client().create_bucket(Bucket="dumps")
    location = _zeros("s3://dumps/job1", end=False)
    assert cli.main(["dump", location, "--reason", "from my laptop"]) == 0
    request = read_request(open_storage(location))
    assert request is not None and request.reason == "from my laptop" and request.rule is None
    # the reader finds the records on S3 as on disk
    first = _poisoned("worker_0", 1, "Net_fc2_output_0")
    open_storage(location).write(record_key("worker_0"),
                                 FlightRecord("worker_0", [], first).to_json())
    trial = create_trial(location)
    assert trial.first_nonfinite() == first and [r.worker for r in trial.flight_records()] == ["worker_0"]


def _poisoned(worker: str, step: int, tensor: str) -> FirstNonFinite:
    return FirstNonFinite(tensor=tensor, step=step, mode="TRAIN", mode_step=step, worker=worker,
                          phase="forward", position=3, nonfinite_tensors=[tensor, "loss"])


def test_trial_reads_flight_records_and_the_first_nonfinite_tensor(tmp_path, caplog):
    path = write_trial(tmp_path / "run", {s: {"w": np.ones(2)} for s in range(0, 30, 10)})
    trial = create_trial(path)
    assert trial.flight_records() == [] and trial.first_nonfinite() is None
    storage = open_storage(path)
    late = _poisoned("worker_0", 13, "Net_fc2_output_0")
    early = _poisoned("worker_1", 12, "Net_relu_output_0")
    dump = Dump(trigger="nonfinite", reason="NaN in Net_fc2_output_0", step=13, mode="TRAIN",
                mode_step=13, time=1.7e9, steps_before=[11, 12], steps_after=[14],
                first_nonfinite=late)
    storage.write(record_key("worker_0"), FlightRecord("worker_0", [dump], late).to_json())
    storage.write(record_key("worker_1"), FlightRecord("worker_1", [], early).to_json())
    storage.write(f"{flight_record.RECORD_DIR}/worker_2.json", b"{damaged")
    with caplog.at_level(logging.WARNING, logger="mltrace.format.flight_record"):
        records = trial.flight_records()
    assert "worker_2.json" in caplog.text  # skipped, named
    assert [r.worker for r in records] == ["worker_0", "worker_1"]
    assert records[0].dumps == [dump] and records[0].recorded_steps == [11, 12, 14]
    assert trial.first_nonfinite() == early  # the lower step wins over the workers
    assert trial.steps() == [0, 10, 20]


def test_mltrace_info_shows_the_first_nonfinite_tensor_and_the_dumps(tmp_path, capsys):
    path = write_trial(tmp_path / "run", {s: {"w": np.ones(2)} for s in range(3)})
    assert cli.main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "tensors:" in out and "non-finite" not in out and "flight recorder" not in out
    first = _poisoned("worker_0", 2, "Net_relu_output_0")
    dump = Dump(trigger="nonfinite", reason="NaN in Net_relu_output_0", step=2, mode="TRAIN",
                mode_step=2, time=1.7e9, steps_before=[0, 1], steps_after=[3, 4], first_nonfinite=first)
    open_storage(path).write(record_key("worker_0"), FlightRecord("worker_0", [dump], first).to_json())
    assert cli.main(["info", path]) == 0
    out = capsys.readouterr().out
    assert ("first non-finite tensor: Net_relu_output_0 at step 2 (TRAIN 2), worker_0, forward pass"
            in out)
    assert ("flight recorder dump at step 2 (worker_0): nonfinite, NaN in Net_relu_output_0; "
            "4 steps written (0..4)") in out


def test_watch_rules_json_actions(tmp_path):
    [plain] = parse_watch_rules([{"RuleName": "VanishingGradient"}])
    assert plain.actions is None
    # an entry without Actions keeps the key it had before Actions existed (restart-safe)
    import hashlib

    old = json.dumps(["VanishingGradient", None, [], None, None, []])
    assert plain.key == f"VanishingGradient-{hashlib.sha1(old.encode()).hexdigest()[:10]}"
    [acting] = parse_watch_rules([{"RuleName": "VanishingGradient",
                                   "Actions": [{"name": "dumpflightrecorder"}]}])
    assert acting.key != plain.key and json.loads(acting.actions or "") == [
        {"name": "dumpflightrecorder"}]
    with pytest.raises(MltraceValueError, match=r"rules\[0\] \(VanishingGradient\): unknown "
                                                "action 'dumpall'"):
        parse_watch_rules([{"RuleName": "VanishingGradient", "Actions": {"name": "dumpall"}}])
    # the watcher runs the rule with its actions: a firing rule asks the live trial to dump
    root = tmp_path / "jobs"
    trial = write_trial(root / "t1", {s: {"gradient/w": np.full(3, 0.5)} for s in range(3)},
                        collections={"gradients": ["gradient/"]})
    rules = parse_watch_rules([{"RuleName": "VanishingGradient",
                                "RuleParameters": {"threshold": "1e6"},
                                "Actions": '{"name": "dumpflightrecorder"}'}])
    watcher = Watcher(str(root), rules, Scheduler(LocalPoolExecutor(1), 1), poll_interval=0.5)
    stats = watcher.run(exit_when_done=True)
    assert [o.rule for o in stats.outcomes] == ["VanishingGradient"]
    request = read_request(open_storage(trial))
    # it fired at steps 0, 1 and 2: one request, at the first
    assert request is not None and request.rule == "VanishingGradient" and request.step == 0


def test_mltrace_dump_and_a_rule_action_reach_a_running_hook(tmp_path):
    """End to end with the hook's own recorder: ``mltrace dump`` during training dumps once
    (trigger manual, the person's reason); the rule action's request dumps with trigger rule."""
    from tests.support.flight_training import train

    out = str(tmp_path / "run")

    def on_step(hook, step):
        if step == 12:
            assert cli.main(["dump", out, "--reason", "loss looks odd"]) == 0
        if step == 30:
            trial = create_trial(out)
            from mltrace.rules.builtin import rule_class

            rule = rule_class("AllZero")(trial, tensor_regex="nothing", threshold=1)
            rule.last_message = "flat loss"
            DumpFlightRecorder().invoke(rule, 29)

    train(out, steps=45, poison_step=None, on_step=on_step, stop_check_interval=0)
    [record] = create_trial(out).flight_records()
    assert [(d.trigger, d.step) for d in record.dumps] == [("manual", 13), ("rule", 31)]
    assert "loss looks odd" in record.dumps[0].reason
    assert "AllZero" in record.dumps[1].reason and "flat loss" in record.dumps[1].reason
    assert record.first_nonfinite is None
