"""Shared fixtures and marker rules. Tests use tmp_path and loopback traffic only: S3 is a real
SeaweedFS server on 127.0.0.1 (tests/support/servers.py), never a remote service.

Fixtures that test modules of more than one folder take: ``s3_server`` (session-scoped, so
SeaweedFS starts once per pytest session, also for tests/legacy) and the MLflow SQLite store,
``mlflow_template_db`` (session) and ``tracking`` (per test). A folder's own shared fixtures are in
its conftest.py; a fixture that one test module uses is in that module.

Markers (registered in pyproject.toml) that follow from fixtures are added here, so that a new test
that uses one of these fixtures is marked without a decorator: ``server`` for the fixtures that
start a server process, ``browser`` for headless Chromium. ``slow`` is set in the test modules;
``legacy`` in tests/legacy/conftest.py.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator

import pytest

from tests.support.s3_process import RestartableS3
from tests.support.servers import S3Server

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Trials opened on an empty directory in tests should fail fast unless a test says otherwise.
os.environ.setdefault("MLTRACE_TRIAL_WAIT", "2")
# The overview's statistics cache (mltrace.analysis.stored) in a folder of this session's, never
# the user's ~/.cache; servers and tools the tests start inherit it.
if "MLTRACE_CACHE_DIR" not in os.environ:
    os.environ["MLTRACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="mltrace-test-cache-")
    atexit.register(shutil.rmtree, os.environ["MLTRACE_CACHE_DIR"], True)

#: Fixtures that start a server process, and where they are defined.
SERVER_FIXTURES = frozenset({
    "s3_server",  # here: SeaweedFS (tests/support/s3_process.py), session-scoped
    "mlflow_server",  # tests/mlflow_plugin/conftest.py: `mlflow server` proxying artifacts to SeaweedFS
    "restartable_s3",  # tests/reliability/test_faults.py: SeaweedFS that a test stops and starts
    "outage_server",  # tests/storage/test_s3.py: the same, one per test
    "fast_server",  # tests/tb_plugin/test_tb_browser.py: `mltrace tensorboard` (Rust loader)
    "python_server",  # tests/tb_plugin/test_tb_browser.py: plain `tensorboard` (Python loader)
    "postgres",  # tests/watch/test_team_setup.py: PostgreSQL (initdb in a temporary folder)
    "mlflow_pg",  # tests/watch/test_team_setup.py: `mlflow server` on PostgreSQL, artifacts on SeaweedFS
    "ray_cluster",  # tests/watch/test_team_setup.py: `ray start` head + one worker node
})
#: Fixtures that start headless Chromium (tests/tb_plugin/test_tb_browser.py,
#: tests/mlflow_plugin/test_mlflow_ui_browser.py).
BROWSER_FIXTURES = frozenset({"browser"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        if used & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS ``weed mini`` (a real S3 server that checks credentials) on free loopback ports."""
    server = RestartableS3(str(tmp_path_factory.mktemp("seaweedfs")))
    try:
        server.start()
        yield server.server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_template_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path of a migrated, empty MLflow SQLite database."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return str(path)


@pytest.fixture
def tracking(tmp_path, monkeypatch, mlflow_template_db) -> Iterator[str]:
    """A fresh SQLite tracking URI in tmp_path (set as MLFLOW_TRACKING_URI; cwd = tmp_path)."""
    # Imported here, not above: tests/support/mlflow_env imports torch and mltrace.pytorch, which a
    # session that never asks for MLflow (the legacy suite, the frontend tests) need not load.
    from tests.support.mlflow_env import end_active_runs, use_tracking_uri

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_template_db, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                     (str(tmp_path / "mlruns" / "0"),))
    uri = f"sqlite:///{db}"
    use_tracking_uri(uri, monkeypatch, tmp_path)
    yield uri
    end_active_runs()
