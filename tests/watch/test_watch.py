"""``mltrace watch`` on local folders with the local process pool and a SQLite tracking store:
RULES.json checks, rule selection, back-pressure, a crashing rule, restart without re-running,
a trial deleted while its rule runs, an unreachable Ray address. The team set-up (S3, Ray,
MLflow on PostgreSQL) is tests/watch/test_team_setup.py."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time

import numpy as np
import pytest
from mlflow import MlflowClient

from mltrace import cli
from mltrace.exceptions import MltraceValueError
from mltrace.trials import create_trial
from mltrace.watch import load_watch_rules, parse_watch_rules, state
from mltrace.watch.executors import LocalPoolExecutor
from mltrace.watch.scheduling import Scheduler
from mltrace.watch.service import Watcher
from tests.support.mlflow_env import train
from tests.support.rule_trials import write_trial

CRASHING_RULE = '''
from mltrace.rules import Rule


class Crashes(Rule):
    def invoke_at_step(self, step):
        if step >= 2:
            raise ZeroDivisionError(f"boom at step {step}")
        return False
'''


def _rules(tmp_path, specs) -> str:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(specs))
    return str(path)


def _watch(location, rules, cap=2, **kwargs) -> Watcher:
    watcher = Watcher(str(location), rules, Scheduler(LocalPoolExecutor(cap), cap),
                      poll_interval=0.5, **kwargs)
    return watcher


@pytest.mark.parametrize("spec, message", [
    ({"RuleName": "NoSuchRule"}, "unknown rule 'NoSuchRule'; known rules are: AdamEpsilonDominance, AdamStaleSecondMoment, AllZero"),
    ({"RuleName": "VanishingGradient", "RuleParameters": {"treshold": "1"}},
     "rule VanishingGradient has no parameter treshold; its parameters are: threshold (default"),
    ({"RuleName": "VanishingGradient", "Trial": "*"}, "unknown keys ['Trial']"),
    ({"RuleName": "VanishingGradient", "Trials": {"Glob": "a/*"}},
     "must be a glob over trial paths"),
    ({"RuleName": "VanishingGradient", "RuntimeConfigurations": {"start-step": "x"}},
     "start-step/end-step"),
])
def test_rules_json_mistakes_are_named(tmp_path, spec, message):
    with pytest.raises(MltraceValueError, match="rules.json\\[0\\]|rules\\[0\\]") as info:
        load_watch_rules(_rules(tmp_path, [spec]))
    assert message in str(info.value)


def test_cli_rejects_bad_rules_and_an_unreachable_ray_address(tmp_path, capsys):
    bad = _rules(tmp_path, [{"RuleName": "VanishingGradient", "RuleParameters": {"bogus": 1}}])
    assert cli.main(["watch", str(tmp_path), "--rules", bad]) == 2
    assert "has no parameter bogus" in capsys.readouterr().err
    good = _rules(tmp_path, [{"RuleName": "VanishingGradient"}])
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        assert cli.main(["watch", str(tmp_path), "--rules", good, "--ray-address", address]) == 2
        err = capsys.readouterr().err
        assert f"cannot connect to the Ray cluster at --ray-address '{address}'" in err
        assert "ray start --head" in err
    assert time.monotonic() - started < 30


def test_selection_crash_and_restart(tracking, tmp_path):
    """Three finished trials: a rule on a/* only, a crashing rule on all. The crash is a FAILED
    MLflow run with the traceback; the other rules go on; a restarted watcher runs nothing again
    and adds no MLflow run."""
    root = tmp_path / "jobs"
    for name in ("a/one", "a/two", "b/three"):
        train(root / name, steps=4, mlflow={"experiment": "watch"})
    (tmp_path / "crash_rule.py").write_text(CRASHING_RULE)
    rules = parse_watch_rules([
        {"RuleName": "VanishingGradient", "RuleParameters": {"threshold": "1.0"}, "Trials": "a/*"},
        {"RuleName": "Crashes", "SourceS3Uri": str(tmp_path / "crash_rule.py")},
    ])
    stats = _watch(root, rules).run(exit_when_done=True)
    got = {(o.trial.split("/jobs/")[1], o.rule): o for o in stats.outcomes}
    assert sorted(got) == [("a/one", "Crashes"), ("a/one", "VanishingGradient"),
                           ("a/two", "Crashes"), ("a/two", "VanishingGradient"),
                           ("b/three", "Crashes")]
    client = MlflowClient()
    for (_trial, rule), outcome in got.items():
        run = client.get_run(outcome.mlflow_run_id)
        if rule == "Crashes":
            assert outcome.status == state.FAILED and "ZeroDivisionError: boom at step 2" in outcome.error
            assert run.info.status == "FAILED"
            text = client.download_artifacts(run.info.run_id, "mltrace/traceback.txt", str(tmp_path))
            with open(text) as f:
                assert "ZeroDivisionError: boom at step 2" in f.read()
        else:
            assert outcome.status == state.FINISHED and outcome.rule_status == "IssuesFound"
            assert run.info.status == "FINISHED"
            parent = client.get_run(run.data.tags["mlflow.parentRunId"])
            assert parent.data.tags["mltrace.rule.VanishingGradient.status"] == "IssuesFound"
        assert state.read_outcome(outcome.trial, outcome.key)["status"] == outcome.status
    runs_before = len(client.search_runs([client.get_experiment_by_name("watch").experiment_id]))

    again = _watch(root, rules).run(exit_when_done=True)
    assert again.trials == 3 and again.outcomes == []
    assert len(client.search_runs(
        [client.get_experiment_by_name("watch").experiment_id])) == runs_before


def test_back_pressure_runs_trials_in_order_under_the_cap(tmp_path):
    root = tmp_path / "jobs"
    for name in ("t1", "t2", "t3", "t4"):
        write_trial(root / name, {s: {"gradient/w": np.full(3, 0.5)} for s in range(3)},
                    collections={"gradients": ["gradient/"]})
    rules = parse_watch_rules([{"RuleName": "VanishingGradient"}])
    watcher = _watch(root, rules, cap=1)
    seen: list[tuple[int, int]] = []
    stats = watcher.run(exit_when_done=True, on_poll=lambda w: seen.append(w.scheduler.counts))
    assert [o.trial.rsplit("/", 1)[1] for o in stats.outcomes] == ["t1", "t2", "t3", "t4"]
    assert max(running for running, _ in seen) == 1
    assert any(waiting >= 2 for _, waiting in seen)  # the others waited in line
    ordered = sorted(stats.outcomes, key=lambda o: o.started)
    assert all(a.ended <= b.started for a, b in zip(ordered, ordered[1:]))


def test_trial_deleted_while_its_rule_runs(tmp_path):
    """A live trial (no end marker) is deleted: the rule stops within a bounded time and reports
    the steps it evaluated; the watcher forgets the trial."""
    root = tmp_path / "jobs"
    trial = write_trial(root / "live", {s: {"gradient/w": np.full(3, 0.5)} for s in range(3)},
                        collections={"gradients": ["gradient/"]}, end=False)
    rules = parse_watch_rules([{"RuleName": "VanishingGradient"}])
    watcher = _watch(root, rules, deletion_check=0.5)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, kwargs={"stop": stop})
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while watcher.scheduler.counts[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # the rule has evaluated the three steps and waits for the fourth
        shutil.rmtree(trial)
        deadline = time.monotonic() + 30
        while not watcher.stats.outcomes and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(30)
    [outcome] = watcher.stats.outcomes
    assert outcome.status == state.DELETED and outcome.evaluated_steps == 3
    assert watcher.finder.scan() == []  # forgotten, and not found again


def test_mlflow_tags_select_trials(tracking, tmp_path):
    root = tmp_path / "jobs"
    train(root / "vision", steps=3, mlflow={"experiment": "tags", "tags": {"team": "vision"}})
    train(root / "nlp", steps=3, mlflow={"experiment": "tags", "tags": {"team": "nlp"}})
    write_trial(root / "untracked", {s: {"gradient/w": np.full(3, 0.5)} for s in range(3)},
                collections={"gradients": ["gradient/"]})  # no MLflow run: never selected
    rules = parse_watch_rules([{"RuleName": "VanishingGradient",
                                "Trials": {"MlflowTags": {"team": "vision"}}},
                               {"RuleName": "AllZero", "Trials": {"PathGlob": "n*"}}])
    stats = _watch(root, rules).run(exit_when_done=True)
    assert sorted((o.trial.rsplit("/", 1)[1], o.rule) for o in stats.outcomes) == [
        ("nlp", "AllZero"), ("vision", "VanishingGradient")]


def test_tracking_server_down_is_retried_and_left_for_a_restart(tracking, tmp_path, monkeypatch,
                                                                caplog):
    """The trial's run file names a tracking server that does not answer (as one whose database
    is down): the rule runs, its result is kept in the trial, the execution is retried a bounded
    number of times and not recorded as finished, so a restart gives it its MLflow run."""
    from mltrace.rules.results import read_results

    trial = tmp_path / "jobs" / "one"
    train(trial, steps=3, mlflow={"experiment": "down"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_file = trial / "mltrace_mlflow_run.json"
    run_file.write_text(json.dumps(dict(json.loads(run_file.read_text()),
                                        tracking_uri=f"http://127.0.0.1:{port}")))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    rules = parse_watch_rules([{"RuleName": "VanishingGradient"}])
    watcher = Watcher(str(tmp_path / "jobs"), rules,
                      Scheduler(LocalPoolExecutor(1), 1, max_attempts=2, retry_delay=0.5),
                      poll_interval=0.5)
    stats = watcher.run(exit_when_done=True)
    [outcome] = stats.outcomes
    assert outcome.status == state.UNAVAILABLE and "MLflow run could not be created" in outcome.error
    assert "could not run after 2 attempts" in caplog.text
    assert state.finished_keys(str(trial)) == set()  # a restart runs it again
    kept = read_results(create_trial(str(trial)).storage)
    assert [r.status for r in kept] == ["NoIssuesFound", "NoIssuesFound"]  # both attempts' results
