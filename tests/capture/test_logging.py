"""Log level from MLTRACE_LOG_LEVEL, SMDEBUG_LOG_LEVEL or TORNASOLE_LOG_LEVEL, applied when the
application asks (``mltrace.configure_logging()``) or builds a hook, never by ``import mltrace``.

Each case runs a fresh interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
LEVEL_VARS = ("MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL")

PROBE = """
import json, logging, sys
import mltrace
mltrace.configure_logging()
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


IMPORT_ONLY = """
import json, logging, sys
import mltrace
before = logging.getLogger("mltrace").level
from mltrace.capture.hook import Hook, HookOptions
Hook(HookOptions(out_dir=sys.argv[1], dry_run=True)).close()
print(json.dumps({"after_import": before, "after_hook": logging.getLogger("mltrace").level}))
"""


def test_import_configures_nothing_and_a_hook_applies_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in LEVEL_VARS}
    env["MLTRACE_LOG_LEVEL"] = "error"
    python = str(PYTHON) if PYTHON.exists() else sys.executable
    proc = subprocess.run([python, "-c", IMPORT_ONLY, str(tmp_path / "run")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state == {"after_import": logging.NOTSET, "after_hook": logging.ERROR}
