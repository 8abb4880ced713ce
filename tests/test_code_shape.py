"""The library's shape limits (issue 11): the hook stays small enough to hold in the head, no
function grows past a screen, and the capture core names no plugin package.

These read the source with ``ast``; they fail with the place to split, not with a count alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIBRARY = ("mltrace", "tb_plugin", "mlflow_plugin")
PLUGIN_PACKAGES = ("mlflow_plugin", "tb_plugin")
HOOK_LIMIT = 350
FUNCTION_LIMIT = 80


def _sources() -> list[Path]:
    return sorted(p for pkg in LIBRARY for p in (REPO / pkg).rglob("*.py"))


def _length(node: ast.AST) -> int:
    return int(node.end_lineno or node.lineno) - int(node.lineno) + 1  # type: ignore[attr-defined]


def test_the_core_hook_class_is_at_most_350_lines() -> None:
    tree = ast.parse((REPO / "mltrace" / "hook.py").read_text(encoding="utf-8"))
    hook = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Hook")
    assert _length(hook) <= HOOK_LIMIT, (
        f"mltrace/hook.py: class Hook is {_length(hook)} lines (limit {HOOK_LIMIT}): move a job into "
        "its part under mltrace/capture/ instead of growing the hook")


def test_no_function_in_the_library_is_longer_than_80_lines() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _length(node) > FUNCTION_LIMIT:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({_length(node)} lines)")
    assert not long, f"functions over {FUNCTION_LIMIT} lines: split them into named steps: {long}"


def test_mltrace_imports_no_plugin_package() -> None:
    found = []
    for path in sorted((REPO / "mltrace").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in PLUGIN_PACKAGES]
    assert not found, f"mltrace/ must reach plugins through mltrace.plugins' entry points: {found}"
