"""What every answer of the MCP server's tools has in common: JSON without non-finite numbers, and
arguments checked against their bounds with an error that names the value and the fix.

JSON has no NaN or infinity (``json.dumps`` writes ``NaN``, which strict parsers refuse), and a
NaN is often the very thing an agent looks for: such values travel as the strings ``"nan"``,
``"inf"`` and ``"-inf"``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError


def json_safe(value: Any) -> Any:
    """``value`` as JSON-ready data: non-finite floats as ``"nan"``, ``"inf"``, ``"-inf"``,
    numpy scalars and arrays as Python numbers and lists, dataclasses as dicts, enums by name,
    tuples and sets as lists; anything else unknown as its ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, np.generic | np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [json_safe(v) for v in items]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    return str(value)


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
