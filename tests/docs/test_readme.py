"""README.md stays short, and every command in it works.

Each fenced ``python`` block of README runs as it is written, in a fresh interpreter, in a
temporary working directory (the quickstarts write ``runs/<framework>`` there): the MXNet one
with .venv-legacy's interpreter (MXNet lives there), the others with this one. Each line of a
``bash`` block is either run here (the shell commands after the quickstarts, on the PyTorch
quickstart's trial) or listed in COVERED_ELSEWHERE with the test or script that runs it, so that a
new command in README fails this test until someone says how it is checked. docs/quickstart.md
includes README's quickstart section, so these tests cover it too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
LEGACY_PYTHON = ROOT / ".venv-legacy" / "bin" / "python"
MAX_LINES = 200

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

#: Shell commands of README that this module does not run, and what runs them.
COVERED_ELSEWHERE = {
    'pip install "mltrace[pytorch]"': "tests/packaging/ (installs the built wheel with its extras)",
    "mltrace tensorboard runs": "tests/tb_plugin/test_tb_browser.py (starts `mltrace tensorboard "
                                "DIR` and drives the tab in Chromium)",
    "bash scripts/demo.sh": "the demo itself (scripts/demo.sh; examples/demo.py)",
    "bash scripts/test.sh": "CI (.ci/run calls scripts/test.sh)",
}
#: Shell commands of README that test_shell_commands runs, after the PyTorch quickstart.
RUN_HERE = [
    "mltrace info runs/pytorch",
    "python -m mltrace.rules.rule_invoker --trial-dir runs/pytorch --rule-name VanishingGradient",
]


def _blocks(language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(README.read_text(encoding="utf-8"))
            if lang == language]


def _python_for(code: str) -> Path:
    return LEGACY_PYTHON if "mltrace.mxnet" in code else Path(sys.executable)


def _block_id(code: str) -> str:
    framework = re.search(r"^import mltrace\.(\w+)", code, re.M)
    return framework.group(1) if framework else code.splitlines()[0][:40]


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_readme_is_short():
    """The README is a front page (what, install, quickstart, demo and tests, links); the
    details live in the documentation site."""
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines, more than {MAX_LINES}: move details to docs/"


def test_readme_has_the_picture_and_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "(docs/assets/tensorboard-tab.png)" in text, "README lost the TensorBoard tab's picture"
    assert (ROOT / "docs/assets/tensorboard-tab.png").stat().st_size < 300_000
    commands = [line for block in _blocks("bash") for line in block.splitlines()]
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert command in commands, f"README lost `{command}`"


def test_every_shell_command_is_checked_somewhere():
    """Each command of a bash block is run here or named in COVERED_ELSEWHERE."""
    commands = [line.strip() for block in _blocks("bash") for line in block.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    assert commands, "no bash block found in README.md"
    unchecked = [c for c in commands if c not in RUN_HERE and c not in COVERED_ELSEWHERE]
    assert not unchecked, f"README commands nobody runs: {unchecked} (run them here, or say where)"
    gone = [c for c in [*RUN_HERE, *COVERED_ELSEWHERE] if c not in commands]
    assert not gone, f"listed here but no longer in README: {gone}"


PYTHON_BLOCKS = _blocks("python")


def test_readme_has_a_quickstart_per_framework():
    ids = {_block_id(code) for code in PYTHON_BLOCKS}
    assert {"pytorch", "tensorflow", "xgboost", "mxnet"} <= ids, f"quickstarts found: {sorted(ids)}"


@pytest.mark.parametrize("code", [
    pytest.param(code, id=_block_id(code)) for code in PYTHON_BLOCKS])
def test_python_block_runs(code: str, tmp_path: Path):
    """The block runs unchanged in a fresh interpreter, exits 0 and leaves a finished trial."""
    python = _python_for(code)
    if not python.exists():
        pytest.skip(f"{python} is missing: scripts/setup.sh builds it")
    script = tmp_path / "readme_block.py"
    script.write_text(code, encoding="utf-8")
    done = _run([str(python), str(script)], tmp_path)
    assert done.returncode == 0, f"README block failed:\n{code}\n--- output ---\n{done.stdout}\n{done.stderr}"
    out_dir = re.search(r'out_dir="([^"]+)"', code)
    if out_dir:
        assert (tmp_path / out_dir.group(1) / "training_job_end.ts").exists(), (
            f"the block ran but left no finished trial in {out_dir.group(1)}")


def test_shell_commands(tmp_path: Path):
    """The commands after the quickstarts, on the trial the PyTorch quickstart leaves."""
    pytorch = next(code for code in PYTHON_BLOCKS if _block_id(code) == "pytorch")
    (tmp_path / "quickstart.py").write_text(pytorch, encoding="utf-8")
    assert _run([sys.executable, "quickstart.py"], tmp_path).returncode == 0

    info = _run(RUN_HERE[0].split(), tmp_path)
    assert info.returncode == 0, info.stderr
    assert "gradient/Sequential_0.weight" in info.stdout and "5 steps" in info.stdout, info.stdout

    argv = RUN_HERE[1].split()
    rule = _run([sys.executable, *argv[1:]], tmp_path)
    # 0: no issue found, 1: the rule's condition was met; both are a rule that ran.
    assert rule.returncode in (0, 1), f"{RUN_HERE[1]} exited {rule.returncode}:\n{rule.stderr}"
    assert "VanishingGradient" in rule.stdout + rule.stderr, rule.stdout
