"""The legacy suite runs in .venv-legacy (numpy 1.23.5, protobuf 3.20.3, smdebug 1.0.34, MXNet).

It is collected only there (scripts/test.sh runs ``pytest tests/legacy`` in that venv).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("MLTRACE_TRIAL_WAIT", "2")
# The cross-checks open smdebug trials only after the run wrote training_job_end.ts, so its
# reader's pause before the final refresh (1 s by default, per trial) buys nothing here.
os.environ.setdefault("SMDEBUG_TRAINING_END_DELAY_REFRESH", "0")


def pytest_configure(config):
    # smdebug 1.0.34 calls APIs that numpy 1.23 and protobuf 3.20 deprecate (ndarray.tostring,
    # unlinked descriptors): those warnings are noise in every cross-check.
    config.addinivalue_line("filterwarnings", r"ignore::DeprecationWarning:smdebug\..*")
    config.addinivalue_line(
        "filterwarnings", r"ignore:Call to deprecated create function:DeprecationWarning")
    # MXNet 1.9.1 touches numpy aliases and distutils that numpy 1.23 / Python 3.11 deprecate.
    config.addinivalue_line("filterwarnings", r"ignore::DeprecationWarning:mxnet\..*")


_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test of this folder is `legacy` (registered in pyproject.toml): it needs .venv-legacy.
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.legacy)
