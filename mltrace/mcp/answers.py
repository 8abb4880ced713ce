"""What every answer of the MCP server's tools has in common besides JSON without non-finite
numbers (``mltrace.format.json_safe``): arguments checked against their bounds with an error that names
the value and the fix.
"""

from __future__ import annotations

from typing import Any

from mltrace.exceptions import MltraceValueError


def bounded(name: str, value: int, low: int, high: int) -> int:
    """``value`` if ``low <= value <= high``.

    Raises:
        MltraceValueError: naming the argument, its value and the range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MltraceValueError(
            f"{name}={value!r} is out of range: pass an integer from {low} to {high}")
    return value


def first_of(items: list[Any], limit: int, what: str, hint: str) -> tuple[list[Any], dict[str, Any]]:
    """The first ``limit`` of ``items``, and the keys that say how many were left out (empty
    when none was): ``{"more": n, "note": "..."}``."""
    if len(items) <= limit:
        return items, {}
    left = len(items) - limit
    return items[:limit], {"more": left, "note": f"{left} more {what} not shown: {hint}"}
