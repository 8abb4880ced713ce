"""Shared fixtures and marker rules. Tests use tmp_path and loopback traffic only: S3 is a real
SeaweedFS server on 127.0.0.1 (tests/servers.py), never a remote service.

Markers (registered in pyproject.toml) that follow from fixtures are added here, so that a new test
that uses one of these fixtures is marked without a decorator: ``server`` for the fixtures that
start a server process, ``browser`` for headless Chromium. ``slow`` is set in the test modules;
``legacy`` in tests/legacy/conftest.py.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Trials opened on an empty directory in tests should fail fast unless a test says otherwise.
os.environ.setdefault("MLTRACE_TRIAL_WAIT", "2")

#: Fixtures that start a server process, and where they are defined.
SERVER_FIXTURES = frozenset({
    "s3_server",  # tests/servers.py: SeaweedFS, session-scoped
    "mlflow_server",  # tests/servers.py: `mlflow server` proxying artifacts to SeaweedFS
    "restartable_s3",  # tests/test_faults.py: SeaweedFS that a test stops and starts
    "outage_server",  # tests/test_s3.py: the same, one per test
    "fast_server",  # tests/test_tb_browser.py: `mltrace tensorboard` (Rust loader)
    "python_server",  # tests/test_tb_browser.py: plain `tensorboard` (Python loader)
    "postgres",  # tests/team_servers.py: PostgreSQL (initdb in a temporary folder)
    "mlflow_pg",  # tests/team_servers.py: `mlflow server` on PostgreSQL, artifacts on SeaweedFS
    "ray_cluster",  # tests/team_servers.py: `ray start` head + one worker node
})
#: Fixtures that start headless Chromium (tests/test_tb_browser.py).
BROWSER_FIXTURES = frozenset({"browser"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        if used & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
