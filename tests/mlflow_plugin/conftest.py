"""Fixtures of the MLflow tests against a real tracking server: ``mlflow_server`` (session-scoped:
started once per pytest session, on SQLite, its artifacts proxied to the SeaweedFS ``s3_server``
of tests/conftest.py) and ``server``, the same server as one test's tracking URI."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.mlflow_env import end_active_runs, use_tracking_uri
from tests.support.servers import MlflowServer, S3Server, running_mlflow_server


@pytest.fixture(scope="session")
def mlflow_server(s3_server: S3Server,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` on SQLite, artifacts proxied to bucket ``mlflow-artifacts`` of s3_server."""
    root = tmp_path_factory.mktemp("mlflow-server")
    with running_mlflow_server(f"sqlite:///{root / 'mlflow.db'}", s3_server, "mlflow-artifacts",
                               root, "mlflow server") as (uri, _):
        yield MlflowServer(uri, "mlflow-artifacts", s3_server)


@pytest.fixture
def server(mlflow_server, monkeypatch, tmp_path) -> Iterator[MlflowServer]:
    """mlflow_server as this test's tracking URI (cwd = tmp_path); runs left active are ended."""
    use_tracking_uri(mlflow_server.uri, monkeypatch, tmp_path)
    yield mlflow_server
    end_active_runs()
