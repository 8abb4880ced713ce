"""Running programs plainly and under ``mltrace run`` for the launch tests (subprocesses, each
with the environment the test gives and no mltrace variables inherited from the caller's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180
#: Variables that would change what a run attaches or logs.
CLEARED = ("MLTRACE_RUN_CONFIG", "MLTRACE_CONFIG_FILE_PATH", "SMDEBUG_CONFIG_FILE_PATH",
           "MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL")


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", **extra)
    # the venv's programs (torchrun) first, as an activated venv has them
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def run(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None,
        timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``args`` (a full command line) as a subprocess; its output captured."""
    return subprocess.run(args, cwd=cwd, env=env or environment(), text=True,
                          capture_output=True, timeout=timeout, check=False)


def plain(script: str | Path, *args: str, cwd: Path = ROOT,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS``."""
    return run([sys.executable, str(script), *args], cwd, env)


def mltrace_run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
                timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m mltrace run ARGS``."""
    return run([sys.executable, "-m", "mltrace", "run", *args], cwd, env, timeout)


def check(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.stdout
