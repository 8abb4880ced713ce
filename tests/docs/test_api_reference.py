"""Every public name of mltrace appears in the API reference of the documentation site.

"Public" as docs/reference/index.md defines it: the names of ``mltrace.__all__``; for each module
directly below ``mltrace`` whose name does not start with an underscore, its ``__all__``, or else
the functions, classes and constants it defines whose names do not start with one; the same for
``mltrace.rules.builtin``, ``mltrace.analysis.utils`` and the MLflow plugin ``mltrace_mlflow``.
A new public module or name is picked up without editing this test.

The check is on the built site: the test builds it with mkdocs (as scripts/test.sh does) and
reads its ``objects.inv``, the inventory of every object the reference renders (and every path it
is re-exported at, which is how ``mltrace.pytorch.SaveConfig`` links to ``SaveConfig``). A name
the reference does not render is missing from it, and the test names it with the page to add it
to. A name a package only loads on first use (``mltrace.rules.invoke_rule``, the names of
``mltrace_mlflow``) counts when the object it resolves to is rendered where it is defined.

``mltrace.mxnet`` does not import here (MXNet lives in .venv-legacy): its names are read from
its source, and mkdocstrings documents it from the source too, without importing it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import pkgutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import mltrace

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"

pytestmark = pytest.mark.slow  # the site's build takes ~20-40 s on 2 cores

#: Public modules beyond the ones directly below mltrace (see the module docstring).
EXTRA_MODULES = ["mltrace.rules.builtin", "mltrace.analysis.utils", "mltrace_mlflow"]
#: Module-level names that are plumbing, not API (the reference's filters hide them too).
NOT_API = {"logger"}


def public_modules() -> list[str]:
    """``mltrace``, each public module directly below it, and EXTRA_MODULES."""
    below = [f"mltrace.{info.name}" for info in pkgutil.iter_modules(mltrace.__path__)
             if not info.name.startswith("_")]
    return ["mltrace", *sorted(below), *EXTRA_MODULES]


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module}: no source found"
    return Path(spec.origin)


def _literal_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                 for t in node.targets)):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return None  # computed (mltrace_mlflow's sorted(_NAMES)): import the module
    return None


def _defined_names(tree: ast.Module) -> list[str]:
    """Top-level functions, classes and assigned names, not imports, not private."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in dict.fromkeys(names) if not n.startswith("_") and n not in NOT_API]


def public_names(module: str) -> list[str]:
    """The module's ``__all__`` (read from its source, else from the imported module), else the
    public names its source defines."""
    tree = ast.parse(_source(module).read_text(encoding="utf-8"))
    names = _literal_all(tree)
    if names is None and any(isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) for n in tree.body):
        names = list(importlib.import_module(module).__all__)
    if names is None:
        names = _defined_names(tree)
    return names


def _canonical(module: str, name: str) -> str | None:
    """Where the object ``module.name`` is defined (its documented home), when it imports."""
    if module.startswith("mltrace.mxnet") and importlib.util.find_spec("mxnet") is None:
        return None
    obj = getattr(importlib.import_module(module), name)
    if inspect.ismodule(obj):
        return obj.__name__
    qualname = getattr(obj, "__qualname__", None)
    where = getattr(obj, "__module__", None)
    if qualname and where:
        # mltrace_tb/mltrace_mlflow are documented under their installed names (setup.py).
        return f"{where}.{qualname}"
    return None


def _inventory(path: Path) -> set[str]:
    """The object names of a Sphinx inventory (version 2), as mkdocstrings writes objects.inv."""
    data = path.read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    assert data.startswith(b"# Sphinx inventory version 2"), f"{path}: not a Sphinx inventory"
    lines = zlib.decompress(data[header_end:]).decode("utf-8").splitlines()
    return {line.split(" ", 1)[0] for line in lines if line.strip()}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} is missing: requirements/main.txt pins mkdocs (scripts/setup.sh)")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # Not --strict: scripts/test.sh runs the strict build; this test is about names only.
    done = subprocess.run([str(MKDOCS), "build", "--site-dir", str(site)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build failed:\n{done.stdout}\n{done.stderr}"
    return _inventory(site / "objects.inv")


def test_public_modules_are_found():
    """The definition finds the front doors users import, so an empty list cannot pass."""
    modules = public_modules()
    for expected in ["mltrace.pytorch", "mltrace.tensorflow", "mltrace.xgboost", "mltrace.mxnet",
                     "mltrace.trials", "mltrace.rules", "mltrace.exceptions", "mltrace.transformers",
                     "mltrace.lightning", "mltrace_mlflow"]:
        assert expected in modules, f"{expected} is not among the public modules: {modules}"
    assert "Hook" in public_names("mltrace.mxnet"), "mltrace.mxnet's __all__ was not read"
    assert "compare_runs" in public_names("mltrace_mlflow"), "mltrace_mlflow's __all__ was not read"
    assert "NoMoreData" in public_names("mltrace.exceptions")


@pytest.mark.parametrize("module", public_modules())
def test_every_public_name_is_in_the_reference(module: str, inventory: set[str]):
    """Each public name of ``module`` is rendered in the API reference (docs/reference/)."""
    missing = []
    for name in public_names(module):
        if f"{module}.{name}" in inventory:
            continue
        home = _canonical(module, name)
        if home is None or home not in inventory:
            missing.append(f"{module}.{name}" + (f" (defined as {home})" if home else ""))
    assert module in inventory, (
        f"{module} has no page in the API reference: add `::: {module}` to a docs/reference/ page")
    assert not missing, (f"not in the API reference (docs/reference/*.md, built site's objects.inv): "
                         f"{missing}")
