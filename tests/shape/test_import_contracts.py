"""The architecture's import contracts ([tool.importlinter] in pyproject.toml; scripts/test.sh
runs them): kept by the tree as it is, and broken, naming the import, once a lower layer imports
a higher one (in a copy of the tree, so the repository is never touched)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
#: import name -> folder (setup.py maps the plugins' folders to their names)
PACKAGES = {"mltrace": "mltrace", "mltrace_tb": "tb_plugin", "mltrace_mlflow": "mlflow_plugin"}


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=where, env=env,
                          capture_output=True, text=True, timeout=300)


def _copy_tree(tmp_path: Path) -> Path:
    for package, folder in PACKAGES.items():
        shutil.copytree(ROOT / folder, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_contracts(tmp_path):
    done = _lint(_copy_tree(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("module, imports, contract", [
    ("mltrace/format/paths.py", "import mltrace.rules", "mltrace's layers"),
    ("mltrace/writer/spill.py", "from mltrace.capture import hook", "mltrace's layers"),
    ("mltrace/trials/index.py", "import mltrace.writer", "mltrace's layers"),
    ("mltrace/capture/clock.py", "import mltrace_mlflow", "never imports them"),
], ids=["format-imports-rules", "writer-imports-capture", "reader-imports-writer", "library-imports-plugin"])
def test_an_import_against_the_layers_breaks_a_contract(tmp_path, module, imports, contract):
    tree = _copy_tree(tmp_path)
    with open(tree / module, "a") as f:
        f.write(f"\n{imports}  # against the architecture\n")
    done = _lint(tree)
    assert done.returncode != 0
    assert "1 broken" in done.stdout and contract in done.stdout
    assert module.removesuffix(".py").replace("/", ".") in done.stdout
