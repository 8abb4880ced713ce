"""A diagnosis made by itself after a flight-recorder dump (mltrace.capture.flight_recorder_diagnosis)
on a real PyTorch run whose fc2 turns NaN at a known step: the report is in the trial once the
dump's after-steps are written (while training goes on), made on a thread of its own, logged in
one line; none for ``diagnose=False`` or a dump asked for by hand; a training that ends first is
diagnosed at close, which waits for it; a diagnosis that fails is one warning."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from mltrace.capture.flight_recorder_diagnosis import THREAD_NAME
from mltrace.capture.json_config import parse_hook_config
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.format import paths
from mltrace.format.flight_record import read_records
from mltrace.storage import open_storage
from tests.support.flight_records import FIVE_REDUCTIONS
from tests.support.flight_training import POISONED, train

POISON, K = 40, 5
REPORT = Path("mltrace_diagnosis") / "worker_0.json"


def _config(**kwargs) -> FlightRecorderConfig:
    """The recorder of tests.support.flight_training, with ``kwargs`` on top."""
    return FlightRecorderConfig(steps=20, after_steps=K, collections=["gradients", "activations", "losses"],
                                reductions=list(FIVE_REDUCTIONS), **kwargs)


def _published(caplog) -> list[logging.LogRecord]:
    """The log records of published diagnoses (mltrace.diagnosis.publish's one line)."""
    return [r for r in caplog.records if r.name == "mltrace.diagnosis" and r.getMessage().startswith("diagnosis of")]


def _wait_for(path: Path, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_a_nan_dump_is_diagnosed_on_its_own_thread_once_its_after_steps_are_written(tmp_path, caplog):
    out = tmp_path / "run"
    seen: dict[int, bool] = {}

    def on_step(hook, step):
        if step == POISON + K - 1:  # the dump's last after-step has not ended yet: no report
            seen[step] = (out / REPORT).exists()
        if step == POISON + K + 5:  # training goes on; the report comes without close
            seen[step] = _wait_for(out / REPORT)

    with caplog.at_level(logging.INFO, logger="mltrace"):
        train(str(out), steps=POISON + K + 10, poison_step=POISON, recorder=_config(), on_step=on_step)
    assert seen == {POISON + K - 1: False, POISON + K + 5: True}
    report = json.loads((out / REPORT).read_text())
    (dump,) = read_records(open_storage(str(out)))[0].dumps
    assert report["found"] is True
    assert report["anomaly"]["step"] == dump.step == POISON
    assert report["anomaly"]["kind"] == "nonfinite" and report["origin"][0]["tensor"] == POISONED
    assert report["steps"]["last"] == POISON + K  # it read the after-steps too
    (logged,) = _published(caplog)  # one dump, one diagnosis
    assert logged.getMessage().startswith(f"diagnosis of {out}: step {POISON}: numerics")
    assert logged.levelno == logging.WARNING
    assert logged.threadName == THREAD_NAME != threading.current_thread().name


def test_diagnose_false_makes_no_diagnosis(tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="mltrace"):
        train(str(out), steps=POISON + K + 3, poison_step=POISON, recorder=_config(diagnose=False))
    assert read_records(open_storage(str(out)))[0].dumps[0].step == POISON  # it dumped
    assert not (out / paths.DIAGNOSIS_DIR).exists()
    assert _published(caplog) == []


def test_a_dump_asked_for_by_hand_is_not_diagnosed(tmp_path, caplog):
    def on_step(hook, step):
        if step == 25:
            hook.dump_flight_recorder("a look at the gradients")

    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="mltrace"):
        train(str(out), steps=40, poison_step=None, recorder=_config(), on_step=on_step)
    (dump,) = read_records(open_storage(str(out)))[0].dumps
    assert (dump.trigger, dump.steps_after) == ("manual", [26, 27, 28, 29, 30])  # complete
    assert not (out / paths.DIAGNOSIS_DIR).exists()
    assert _published(caplog) == []


def test_training_that_ends_before_the_after_steps_is_diagnosed_at_close_which_waits(tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="mltrace"):
        train(str(out), steps=POISON + 2, poison_step=POISON, recorder=_config())
    # close returned: the report is there already (close waited for the thread)
    report = json.loads((out / REPORT).read_text())
    assert report["found"] is True and report["anomaly"]["step"] == POISON
    assert report["steps"]["last"] == POISON + 1
    (logged,) = _published(caplog)
    assert logged.threadName == THREAD_NAME


@pytest.mark.parametrize("max_dumps", [1, 2])
def test_each_dump_up_to_max_dumps_gets_one_diagnosis(tmp_path, caplog, max_dumps):
    """A NaN at step 40, a loss spike at step 70: a dump and a diagnosis each, up to max_dumps."""
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="mltrace"):
        train(str(out), steps=80, poison_step=POISON, loss_scale_at=70,
              recorder=_config(max_dumps=max_dumps))
    dumps = read_records(open_storage(str(out)))[0].dumps
    assert [(d.trigger, d.step) for d in dumps] == [("nonfinite", POISON), ("loss_spike", 70)][:max_dumps]
    assert len(_published(caplog)) == max_dumps
    # the last diagnosis rewrote the report, once the last dump's after-steps were written
    assert json.loads((out / REPORT).read_text())["steps"]["last"] == dumps[-1].step + K


def test_a_diagnosis_that_fails_is_one_warning_and_training_goes_on(tmp_path, caplog):
    out = tmp_path / "run"
    collections = out / paths.collections_file_key("worker_0")

    def on_step(hook, step):
        if step == POISON + 1:  # the trial cannot be opened when the diagnosis reads it
            collections.unlink()

    with caplog.at_level(logging.WARNING, logger="mltrace"):
        run = train(str(out), steps=POISON + K + 3, poison_step=POISON, recorder=_config(), on_step=on_step)
    assert len(run.losses) == POISON + K + 3  # every step ran
    failed = [r for r in caplog.records if "no diagnosis of the dump at step 40" in r.getMessage()]
    assert len(failed) == 1 and "MissingCollectionFiles" in failed[0].getMessage()
    assert failed[0].threadName == THREAD_NAME
    assert not (out / paths.DIAGNOSIS_DIR).exists()


def test_the_switch_is_a_field_of_the_config_and_its_json_form():
    assert FlightRecorderConfig().diagnose is True
    assert FlightRecorderConfig.parse({"diagnose": False}).diagnose is False
    config = parse_hook_config({"LocalPath": "/tmp/run", "FlightRecorder": {"steps": "30", "diagnose": "false"}})
    assert config.hook_kwargs["flight_recorder"].diagnose is False
    config = parse_hook_config({"LocalPath": "/tmp/run", "FlightRecorder": {"diagnose": "true"}})
    assert config.hook_kwargs["flight_recorder"].diagnose is True
