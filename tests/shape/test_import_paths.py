"""Every import path users were shown still imports: the ``mltrace`` imports written in README,
the docs and the examples (read from the files, so a new one is checked too), and those of the
smdebug and Tornasole documents mltrace ports (``smdebug``/``tornasole`` read as ``mltrace``).
smdebug's own module paths and package-level names are checked in test_porting_hooks.py."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FROM = re.compile(r"^\s*(?:>>>\s*)?from (mltrace(?:\.\w+)*) import ([\w, ]+?)\s*(?:#.*)?$", re.M)
_IMPORT = re.compile(r"^\s*(?:>>>\s*)?import (mltrace(?:\.\w+)*)(?: as \w+)?\s*(?:#.*)?$", re.M)

#: The imports of the five user documents mltrace runs unchanged but for the package name.
SEED_IMPORTS = [
    ("mltrace", ["SaveConfig"]),
    ("mltrace.trials", ["create_trial"]),
    ("mltrace.pytorch", ["TornasoleHook", "Collection"]),
    ("mltrace.tensorflow", ["TornasoleHook", "get_collection", "modes", "SaveConfigMode"]),
    ("mltrace.rules", ["Rule"]),
    ("mltrace.rules.rule", ["Rule"]),
    ("mltrace.rules.rule_invoker", ["invoke_rule"]),
    ("mltrace.exceptions", ["NoMoreData"]),
    ("mltrace.analysis.utils", ["no_refresh", "refresh"]),
]


def _written_imports() -> list[tuple[str, list[str], str]]:
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
               *sorted((ROOT / "examples").rglob("*.py"))]
    found: dict[tuple[str, tuple[str, ...]], str] = {}
    for path in sources:
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(ROOT))
        for module, names in _FROM.findall(text):
            key = (module, tuple(n.strip() for n in names.split(",") if n.strip()))
            found.setdefault(key, where)
        for module in _IMPORT.findall(text):
            found.setdefault((module, ()), where)
    return [(module, list(names), where) for (module, names), where in sorted(found.items())]


def _check(module: str, names: list[str]) -> None:
    if module.startswith("mltrace.mxnet") and importlib.util.find_spec("mxnet") is None:
        pytest.skip("MXNet lives in .venv-legacy (tests/legacy imports mltrace.mxnet)")
    imported = importlib.import_module(module)
    missing = [n for n in names if not hasattr(imported, n)
               and importlib.util.find_spec(f"{module}.{n}") is None]
    assert not missing, f"from {module} import {', '.join(missing)}: not there"


WRITTEN = _written_imports()


def test_the_documents_show_imports_at_all():
    modules = {module for module, _, _ in WRITTEN}
    assert {"mltrace.pytorch", "mltrace.trials", "mltrace.transformers", "mltrace.lightning"} <= modules


@pytest.mark.parametrize("module, names, where", WRITTEN,
                         ids=[f"{w}:{m}" for m, _, w in WRITTEN])
def test_an_import_written_in_the_docs_or_examples_works(module, names, where):
    _check(module, names)


@pytest.mark.parametrize("module, names", SEED_IMPORTS, ids=[m for m, _ in SEED_IMPORTS])
def test_an_import_of_the_ported_documents_works(module, names):
    _check(module, names)
