"""Reading the library's source with ``ast`` for the shape tests (test_code_shape.py,
test_reader_api.py)."""

from __future__ import annotations

import ast
from pathlib import Path


def private_reaches(path: Path) -> list[tuple[str, int]]:
    """(member, line) of each ``x._name`` where x is not self/cls, and of each
    ``getattr(x, "_name", ...)`` (also hasattr/setattr) on another object than self."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = None
        if isinstance(node, ast.Attribute):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                name = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
              and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            name = node.args[1].value
        if name and name.startswith("_") and not name.startswith("__"):
            found.append((name, node.lineno))
    return found
