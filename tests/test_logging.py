"""Log level from MLTRACE_LOG_LEVEL, SMDEBUG_LOG_LEVEL or TORNASOLE_LOG_LEVEL, read at import.

Each case runs a fresh interpreter: the variables are read once, when mltrace is imported.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
LEVEL_VARS = ("MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL")

PROBE = """
import json, logging, sys
import mltrace
logger = logging.getLogger("mltrace")
child = logging.getLogger("mltrace.probe")
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)  # a user's root handler
child.debug("probe-debug-message")
child.critical("probe-critical-message")
print(json.dumps({"level": logger.level, "disabled": logger.disabled,
                  "handlers": len(logger.handlers), "effective": child.getEffectiveLevel()}))
"""


def run_probe(env_vars: dict[str, str]) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in LEVEL_VARS}
    env.update(env_vars)
    python = str(PYTHON) if PYTHON.exists() else sys.executable
    proc = subprocess.run(
        [python, "-c", PROBE],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize(
    ("env_vars", "level"),
    [
        ({"MLTRACE_LOG_LEVEL": "debug"}, logging.DEBUG),
        ({"MLTRACE_LOG_LEVEL": "INFO"}, logging.INFO),
        ({"SMDEBUG_LOG_LEVEL": "error"}, logging.ERROR),
        ({"TORNASOLE_LOG_LEVEL": "warning"}, logging.WARNING),
        ({"MLTRACE_LOG_LEVEL": "debug", "SMDEBUG_LOG_LEVEL": "error"}, logging.DEBUG),
        ({"SMDEBUG_LOG_LEVEL": "critical", "TORNASOLE_LOG_LEVEL": "debug"}, logging.CRITICAL),
    ],
)
def test_level_from_environment(env_vars, level):
    state, _ = run_probe(env_vars)
    assert state["level"] == level
    assert state["effective"] == level
    assert state["disabled"] is False


def test_debug_level_shows_debug_messages_on_stderr():
    _, stderr = run_probe({"MLTRACE_LOG_LEVEL": "debug"})
    assert "probe-debug-message" in stderr


def test_error_level_hides_debug_messages():
    _, stderr = run_probe({"SMDEBUG_LOG_LEVEL": "error"})
    assert "probe-debug-message" not in stderr
    assert "probe-critical-message" in stderr


def test_off_disables_the_logger_and_its_children():
    state, stderr = run_probe({"TORNASOLE_LOG_LEVEL": "OFF"})
    assert state["disabled"] is True
    assert state["level"] > logging.CRITICAL
    assert state["effective"] > logging.CRITICAL
    assert state["handlers"] == 0
    assert "probe-critical-message" not in stderr
    assert "probe-debug-message" not in stderr


def test_unset_leaves_the_logger_alone():
    state, _ = run_probe({})
    assert state == {
        "level": logging.NOTSET,
        "disabled": False,
        "handlers": 0,
        "effective": logging.DEBUG,
    }


def test_bad_level_warns_and_names_the_variable():
    state, stderr = run_probe({"MLTRACE_LOG_LEVEL": "loud"})
    assert state["level"] == logging.NOTSET
    assert "MLTRACE_LOG_LEVEL" in stderr and "'loud'" in stderr
