"""A team's set-up, all real: MLflow server on PostgreSQL with artifacts on SeaweedFS (S3), trials
on S3, and ``mltrace watch`` running rules on a two-node Ray cluster while jobs train.

Servers are session-scoped: SeaweedFS is the suite's ``s3_server`` (tests/conftest.py), PostgreSQL,
MLflow on it and Ray are this module's fixtures over tests/support/team_servers.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import mlflow
import pytest
from mlflow import MlflowClient

from mltrace.rules import invoke_rule
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.rules.results import read_results
from mltrace.trials import create_trial
from mltrace_mlflow.compare import compare_runs
from tests.support.mlflow_env import train
from tests.support.servers import S3_KEY, S3_SECRET
from tests.support.team_servers import (
    MlflowPgServer,
    PostgresServer,
    RayCluster,
    running_mlflow_pg,
    running_postgres,
    running_ray_cluster,
)

pytestmark = [pytest.mark.slow, pytest.mark.server]
BIN = os.path.dirname(sys.executable)
SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
LOSS = "MSELoss_output_0"
STATUS = "mltrace.rule.VanishingGradient.status"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A running PostgreSQL server with an empty ``mlflow`` database."""
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def mlflow_pg(postgres, s3_server, tmp_path_factory) -> Iterator[MlflowPgServer]:
    """``mlflow server`` on that PostgreSQL, artifacts proxied to bucket ``mlflow-pg-artifacts``."""
    with running_mlflow_pg(postgres, s3_server, tmp_path_factory.mktemp("mlflow-pg")) as server:
        yield server


@pytest.fixture(scope="session")
def ray_cluster(s3_server) -> Iterator[RayCluster]:
    """A two-node Ray cluster (head 127.0.0.2, worker 127.0.0.3) with the S3 server's credentials."""
    with running_ray_cluster(s3_server) as cluster:
        yield cluster


@pytest.fixture
def team(mlflow_pg, monkeypatch, tmp_path):
    """The process environment of a team member: tracking server, S3 credentials."""
    s3 = mlflow_pg.s3
    for key, value in {"MLFLOW_TRACKING_URI": mlflow_pg.uri, "MLFLOW_DISABLE_TELEMETRY": "true",
                       "AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": S3_KEY,
                       "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                       "MLTRACE_MLFLOW_PROCESS": "0"}.items():
        monkeypatch.setenv(key, value)
    for var in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLTRACE_MLFLOW_PARENT_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    yield mlflow_pg
    while mlflow.active_run() is not None:
        mlflow.end_run()


def _pg_count(server, sql: str) -> int:
    import psycopg2

    from tests.support.team_servers import PG_PASSWORD, PG_USER

    conn = psycopg2.connect(host="127.0.0.1", port=server.postgres.port, user=PG_USER,
                            password=PG_PASSWORD, dbname="mlflow")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def test_hook_rules_tags_and_compare_on_postgresql(team, tmp_path):
    hook, losses = train(tmp_path / "trial", steps=5, mlflow={"experiment": "pg-team"})
    run_id = hook.sinks[0].run_id
    client = MlflowClient()
    history = sorted(client.get_metric_history(run_id, LOSS), key=lambda m: m.step)
    assert [m.value for m in history] == pytest.approx(losses["TRAIN"], rel=1e-6)
    # The run is a row of PostgreSQL's runs table, its metrics rows of metrics.
    assert _pg_count(team, f"SELECT count(*) FROM runs WHERE run_uuid = '{run_id}'") == 1
    assert _pg_count(team, f"SELECT count(*) FROM metrics WHERE run_uuid = '{run_id}' "
                           f"AND key = '{LOSS}'") == 5
    result = invoke_rule(VanishingGradient(create_trial(str(tmp_path / "trial")), threshold=1.0),
                         end_step=5)
    child = client.get_run(result.mlflow_run_id)
    assert child.data.tags["mlflow.parentRunId"] == run_id
    found = mlflow.search_runs(experiment_names=["pg-team"],
                               filter_string=f"tags.`{STATUS}` = 'IssuesFound'")
    assert list(found["run_id"]) == [run_id]
    comparison = compare_runs(["pg-team"], tensors=[LOSS], out_dir=str(tmp_path / "cmp"))
    assert [r["run_id"] for r in comparison.rows] == [run_id]
    listing = team.s3.client().list_objects_v2(
        Bucket=team.bucket, Prefix=f"{child.info.experiment_id}/{child.info.run_id}/artifacts/")
    assert any(o["Key"].endswith("mltrace/rule_result.json") for o in listing["Contents"])


def test_postgresql_down_loses_nothing(team, tmp_path, monkeypatch, caplog):
    """With PostgreSQL stopped, the tracking server answers errors: the hook logs and keeps the
    trial, a rule's result is still written into the trial; runs written before are intact once
    PostgreSQL is back."""
    hook, _ = train(tmp_path / "before", steps=3, mlflow={"experiment": "pg-outage"})
    before = hook.sinks[0].run_id
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    team.postgres.stop()
    try:
        caplog.set_level(logging.WARNING, logger="mltrace")
        started = time.monotonic()
        train(tmp_path / "during", steps=3, mlflow={"experiment": "pg-outage"})
        trial = create_trial(str(tmp_path / "during"))
        assert trial.steps() == [0, 1, 2]  # the tensors are saved
        result = invoke_rule(VanishingGradient(trial, threshold=1.0), end_step=3)
        assert result.status == "IssuesFound" and result.mlflow_run_id is None
        assert [r.run_id for r in read_results(trial.storage)] == [result.run_id]
        assert time.monotonic() - started < 120
        logged = " ".join(r.getMessage() for r in caplog.records)
        assert "mlflow" in logged.lower()
    finally:
        team.postgres.start()
    run = MlflowClient().get_run(before)
    assert run.info.status == "FINISHED" and len(
        MlflowClient().get_metric_history(before, LOSS)) == 3


def _rule_runs(client, experiment_id, trial):
    return client.search_runs([experiment_id], filter_string=(
        f"tags.`mltrace.run_type` = 'rule' AND tags.`mltrace.trial` = '{trial}'"))


def _watcher(args, env, log):
    out = open(log, "ab")
    return subprocess.Popen([os.path.join(BIN, "mltrace"), "watch", *args], env=env, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def _wait_for(check, timeout, what, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tail = ""
    if log and os.path.exists(log):
        with open(log, errors="replace") as f:
            tail = f.read()[-4000:]
    raise AssertionError(f"{what} not within {timeout} s\n{tail}")


def test_watch_on_ray_while_jobs_train(team, ray_cluster, tmp_path):
    """Three jobs train one after another into an S3 prefix (the second with vanishing
    gradients); the watcher runs on the Ray cluster, is SIGKILLed while the second trains and
    started again. Every trial's rules ran while it trained, once each; the bad job is tagged."""
    s3 = team.s3
    s3.client().create_bucket(Bucket="team-trials")
    prefix = "s3://team-trials/jobs"
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([
        {"RuleName": "VanishingGradient", "Trials": "*"},
        {"RuleName": "LossNotDecreasing", "RuleParameters": {"mode": "TRAIN"},
         "Trials": {"MlflowTags": {"team": "vision"}}},
    ]))
    env = dict(os.environ, **ray_cluster.env)
    log = str(tmp_path / "watch.log")
    args = [prefix, "--rules", str(rules), "--ray-address", ray_cluster.address,
            "--poll-interval", "1", "--max-concurrent", "4"]
    watcher = _watcher(args, env, log)
    client = MlflowClient()
    trials = {name: f"{prefix}/{name}" for name in ("job1", "job2-bad", "job3")}

    def train_job(name, *extra):
        return subprocess.Popen(
            [sys.executable, os.path.join(SUPPORT, "watch_training.py"), trials[name], "--steps",
             "60", "--sleep", "0.35", "--tag", "team=vision", "--experiment", "team-watch",
             *extra], env=env, stdin=subprocess.DEVNULL)

    try:
        job = train_job("job1")
        assert job.wait(180) == 0
        job = train_job("job2-bad", "--vanishing")
        experiment = None

        def rules_started():
            nonlocal experiment
            exp = client.get_experiment_by_name("team-watch")
            experiment = exp.experiment_id if exp else None
            return experiment and len(_rule_runs(client, experiment, trials["job2-bad"])) == 2

        _wait_for(rules_started, 120, "the bad job's rule runs", log)
        os.killpg(watcher.pid, signal.SIGKILL)  # mid-way: both of job2's rules are live
        watcher.wait(10)
        watcher = _watcher(args, env, log)
        assert job.wait(180) == 0
        job = train_job("job3")
        assert job.wait(180) == 0

        def all_recorded():
            listing = s3.client().list_objects_v2(Bucket="team-trials", Prefix="jobs/")
            keys = [o["Key"] for o in listing.get("Contents", [])]
            return sum("/mltrace_watch/" in k for k in keys) == 6

        _wait_for(all_recorded, 180, "six finished rule executions", log)
    finally:
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGTERM)
            watcher.wait(30)
    with open(log) as f:
        text = f.read()
    assert text.count(f"watching {prefix} with 2 rules") == 2 and "on Ray cluster at" in text
    assert f"found trial {trials['job1']}: 2 rules finished before, 0 to consider" in text
    for name in ("job2-bad", "job3"):  # found while training: an actor per live rule
        assert f"starting VanishingGradient on {trials[name]} (live" in text
    for name, trial in trials.items():
        [training] = client.search_runs([experiment], filter_string=(
            f"tags.`mltrace.run_type` = 'training' AND tags.`mltrace.trial` = '{trial}'"))
        runs = _rule_runs(client, experiment, trial)
        assert sorted(r.data.tags["mltrace.rule"] for r in runs) == [
            "LossNotDecreasing", "VanishingGradient"], name  # once each, restart or not
        for run in runs:
            assert run.info.status == "FINISHED"
            assert run.data.tags["mlflow.parentRunId"] == training.info.run_id
            assert run.info.start_time < training.info.end_time, (
                name, run.data.tags["mltrace.rule"], "ran after training", text[-6000:])
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "condition_met")]
            assert len(steps) == len(set(steps)) > 0  # resumed runs log no step twice
        expected = "IssuesFound" if name == "job2-bad" else "NoIssuesFound"
        assert training.data.tags[STATUS] == expected, name


def test_watch_through_ray_client(ray_cluster, tmp_path):
    """``--ray-address ray://HOST:PORT`` (Ray Client): executions run in the cluster's worker
    processes, not in the watcher's, and so does the diagnosis of the trial whose rule fired."""
    import numpy as np

    from mltrace.watch import parse_watch_rules
    from mltrace.watch.ray_executor import RayExecutor
    from mltrace.watch.scheduling import Scheduler
    from mltrace.watch.service import Watcher
    from tests.support.rule_trials import write_trial

    for name, grad in (("ok", 0.5), ("vanishing", 1e-9)):
        write_trial(tmp_path / "jobs" / name, {s: {"gradient/w": np.full(3, grad)} for s in range(4)},
                    collections={"gradients": ["gradient/"]})
    executor = RayExecutor(ray_cluster.client_address, num_cpus=0.5)
    assert "2 nodes" in executor.description
    stats = Watcher(str(tmp_path / "jobs"), parse_watch_rules([{"RuleName": "VanishingGradient"}]),
                    Scheduler(executor, 2), poll_interval=0.5).run(exit_when_done=True)
    found = {o.trial.rsplit("/", 1)[1]: o for o in stats.outcomes}
    assert {k: o.rule_status for k, o in found.items()} == {"ok": "NoIssuesFound",
                                                            "vanishing": "IssuesFound"}
    assert all(not o.host.endswith(f":{os.getpid()}") for o in stats.outcomes)
    # The rule that fired is trouble: the trial is diagnosed on the cluster, where it was read.
    from mltrace.diagnosis.stored import read_reports
    from mltrace.storage import open_storage

    assert {k: o.diagnosis for k, o in found.items()} == {"ok": "no trouble",
                                                          "vanishing": "published"}
    [report] = read_reports(open_storage(str(tmp_path / "jobs" / "vanishing")))
    assert report["worker"] == "worker_0" and report["steps"]["last"] == 3
    assert not (tmp_path / "jobs" / "ok" / "mltrace_diagnosis").exists()
