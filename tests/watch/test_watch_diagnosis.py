"""``mltrace watch`` diagnoses a trial that broke (mltrace.watch.diagnosis), with the local process
pool on trials written by mltrace's own writer: a non-finite loss a rule finds and a
flight-recorder dump are diagnosed into ``mltrace_diagnosis/worker_0.json``; a healthy trial and a
dump a person asked for are not; executions that end together publish once; a later pass leaves an
up-to-date report alone and diagnoses again once the trial grew with new trouble; ``--no-diagnose``
writes nothing; a diagnosis that fails leaves the rule's outcome finished. On Ray:
tests/watch/test_team_setup.py (test_watch_through_ray_client)."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from mltrace import cli
from mltrace.diagnosis.stored import read_reports
from mltrace.format.flight_record import Dump, FlightRecord, record_key
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from mltrace.watch import parse_watch_rules, state
from mltrace.watch.diagnosis import (
    CLAIM_KEY,
    LEFT_TO_ANOTHER,
    NO_TROUBLE,
    PUBLISHED,
    UP_TO_DATE,
    diagnose_trouble,
    up_to_date,
)
from mltrace.watch.executors import LocalPoolExecutor
from mltrace.watch.scheduling import Scheduler
from mltrace.watch.service import Watcher, WatchStats
from tests.support.rule_trials import write_trial

STEPS = 10
#: fires at the first step a tensor holds a NaN or an infinity
EXPLODING = {"RuleName": "ExplodingTensor"}
#: the same rule with another configuration: another execution of the same trial
EXPLODING_NAN = {"RuleName": "ExplodingTensor", "RuleParameters": {"only_nan": "true"}}


def _trial(root: Path, name: str, nan_at: int | None = None, steps: range = range(STEPS),
           dump: tuple[str, int] | None = None) -> Path:
    """A trial of ``steps`` steps of a falling loss (NaN at ``nan_at``) and a steady gradient,
    with a flight-recorder record of one dump (trigger, step) when given."""
    data = {s: {"loss": np.float32(np.nan if s == nan_at else 1.0 / (s + 1)),
                "gradient/w": np.full(3, 0.5)} for s in steps}
    path = Path(write_trial(root / name, data,
                            collections={"losses": ["loss"], "gradients": ["gradient/"]}))
    if dump is not None:
        trigger, step = dump
        record = FlightRecord("worker_0", [Dump(trigger, f"{trigger} at step {step}", step, "TRAIN",
                                                step, time.time(), steps_before=[step])])
        open_storage(str(path)).write(record_key("worker_0"), record.to_json())
    return path


def _watch(root: Path, specs: list[dict], cap: int = 2, diagnose: bool = True) -> WatchStats:
    watcher = Watcher(str(root), parse_watch_rules(specs), Scheduler(LocalPoolExecutor(cap), cap),
                      poll_interval=0.5, diagnose=diagnose)
    return watcher.run(exit_when_done=True)


def _reports(path: Path) -> list[dict]:
    return read_reports(open_storage(str(path)))


def _by_trial(stats: WatchStats) -> dict[str, state.Outcome]:
    return {Path(o.trial).name: o for o in stats.outcomes}


def test_a_broken_trial_is_diagnosed_and_a_healthy_one_is_not(tmp_path):
    root = tmp_path / "jobs"
    nan = _trial(root, "nan", nan_at=6)  # ExplodingTensor fires at step 6
    dumped = _trial(root, "dumped", dump=("loss_spike", 7))  # the hook's flight recorder dumped
    manual = _trial(root, "manual", dump=("manual", 7))  # a person asked: no trouble
    healthy = _trial(root, "healthy")
    outcomes = _by_trial(_watch(root, [EXPLODING]))
    assert {name: (o.status, o.rule_status, o.diagnosis) for name, o in outcomes.items()} == {
        "nan": (state.FINISHED, "IssuesFound", PUBLISHED),
        "dumped": (state.FINISHED, "NoIssuesFound", PUBLISHED),
        "manual": (state.FINISHED, "NoIssuesFound", NO_TROUBLE),
        "healthy": (state.FINISHED, "NoIssuesFound", NO_TROUBLE)}
    [report] = _reports(nan)
    assert (nan / "mltrace_diagnosis" / "worker_0.json").is_file()
    assert report["found"] is True and report["worker"] == "worker_0"
    assert report["anomaly"]["step"] == 6 and report["anomaly"]["kind"] == "nonfinite"
    assert report["steps"]["last"] == STEPS - 1
    [report] = _reports(dumped)
    assert report["found"] is True
    assert (report["anomaly"]["step"], report["anomaly"]["kind"]) == (7, "flight_recorder")
    for path in (manual, healthy):
        assert not (path / "mltrace_diagnosis").exists()
    for path in (nan, dumped, manual, healthy):
        assert not (path / CLAIM_KEY).exists()  # the claim is gone once the diagnosis is done


def test_two_rules_that_fire_together_publish_once(tmp_path):
    root = tmp_path / "jobs"
    nan = _trial(root, "nan", nan_at=6)
    stats = _watch(root, [EXPLODING, EXPLODING_NAN], cap=2)  # both run at once and both fire
    assert [o.rule_status for o in stats.outcomes] == ["IssuesFound", "IssuesFound"]
    done = sorted(o.diagnosis or "" for o in stats.outcomes)
    assert done.count(PUBLISHED) == 1 and set(done) <= {PUBLISHED, UP_TO_DATE, LEFT_TO_ANOTHER}
    assert [r["found"] for r in _reports(nan)] == [True]
    assert not (nan / CLAIM_KEY).exists()


def test_executions_that_end_together_leave_the_diagnosis_to_one(tmp_path):
    """Four executions of one trial finish at the same moment (threads here, pool or Ray workers
    in a watcher): one claims the diagnosis and publishes it, the others leave it to that one."""
    nan = _trial(tmp_path / "jobs", "nan", nan_at=6, dump=("nonfinite", 6))
    trials = [create_trial(str(nan)) for _ in range(4)]  # each execution opens its own
    start = threading.Barrier(len(trials))

    def one(trial):
        start.wait()
        return diagnose_trouble(trial)

    with ThreadPoolExecutor(len(trials)) as pool:
        done = sorted(pool.map(one, trials))
    # the others left it to the one (a thread late to look would find it done: up to date)
    assert done.count(PUBLISHED) == 1 and LEFT_TO_ANOTHER in done
    assert set(done) <= {PUBLISHED, LEFT_TO_ANOTHER, UP_TO_DATE}
    assert [r["found"] for r in _reports(nan)] == [True]
    assert not (nan / CLAIM_KEY).exists()


def test_a_later_pass_keeps_an_up_to_date_report_and_a_grown_trial_is_diagnosed_again(tmp_path):
    root = tmp_path / "jobs"
    nan = _trial(root, "nan", nan_at=6)
    [first] = _watch(root, [EXPLODING]).outcomes
    assert first.diagnosis == PUBLISHED
    report = nan / "mltrace_diagnosis" / "worker_0.json"
    content, mtime = report.read_bytes(), report.stat().st_mtime_ns
    time.sleep(0.05)  # a rewrite would show in the modification time

    [second] = _watch(root, [EXPLODING_NAN]).outcomes  # a new rule: a new pass over the trial
    assert second.rule_status == "IssuesFound" and second.diagnosis == UP_TO_DATE
    assert report.read_bytes() == content and report.stat().st_mtime_ns == mtime

    # The trial grows (steps 10-14) and the flight recorder dumps at step 12, after the steps
    # the report read: the next pass diagnoses it again, reading the new steps.
    _trial(root, "nan", steps=range(STEPS, STEPS + 5), dump=("nonfinite", 12))
    [third] = _watch(root, [{"RuleName": "ExplodingTensor", "RuleParameters": {
        "collection_names": "losses"}}]).outcomes
    assert third.diagnosis == PUBLISHED
    [again] = _reports(nan)
    assert again["steps"]["last"] == STEPS + 4 and again["anomaly"]["step"] == 6


def test_what_counts_as_up_to_date():
    assert not up_to_date(None, trouble=6, last_step=9)  # no report yet
    assert up_to_date(9, trouble=6, last_step=9)  # the report read the trouble step
    assert up_to_date(9, trouble=6, last_step=20)  # ...and more steps came: still explained
    assert not up_to_date(9, trouble=12, last_step=14)  # new trouble in new steps
    assert up_to_date(9, trouble=12, last_step=9)  # nothing new to read (trouble not saved)


@pytest.fixture
def cli_logging():
    """``mltrace watch`` configures the ``mltrace`` logger and signal handlers of this process:
    put them back after the test."""
    logger = logging.getLogger("mltrace")
    handlers, level = list(logger.handlers), logger.level
    signals = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    logger.handlers[:], logger.level = handlers, level
    for sig, handler in signals.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("flags, diagnosed", [([], True), (["--no-diagnose"], False)])
def test_the_command_diagnoses_unless_told_not_to(tmp_path, cli_logging, flags, diagnosed):
    root = tmp_path / "jobs"
    nan = _trial(root, "nan", nan_at=6)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([EXPLODING]))
    assert cli.main(["watch", str(root), "--rules", str(rules), "--exit-when-done",
                     "--poll-interval", "0.5", "--max-concurrent", "1", *flags]) == 0
    [key] = state.finished_keys(str(nan))  # the rule ran and fired either way
    outcome = state.read_outcome(str(nan), key)
    assert outcome["rule_status"] == "IssuesFound"
    assert outcome["diagnosis"] == (PUBLISHED if diagnosed else None)
    assert (nan / "mltrace_diagnosis" / "worker_0.json").exists() is diagnosed


def test_a_diagnosis_that_fails_is_a_warning_and_the_rule_finishes(tmp_path):
    root = tmp_path / "jobs"
    nan = _trial(root, "nan", nan_at=6)
    (nan / CLAIM_KEY).mkdir(parents=True)  # the claim cannot be read or written
    [outcome] = _watch(root, [EXPLODING]).outcomes
    assert outcome.status == state.FINISHED and outcome.rule_status == "IssuesFound"
    assert outcome.diagnosis.startswith("failed: IsADirectoryError")
    assert state.finished_keys(str(nan)) == {outcome.key}  # recorded: not run again
    assert not (nan / "mltrace_diagnosis").exists()
