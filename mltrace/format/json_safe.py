"""Values as strict JSON takes them. JSON has no NaN or infinity (``json.dumps`` writes ``NaN``,
which strict parsers and browsers refuse), and a NaN is often the very thing a reader looks for:
such values travel as the strings ``"nan"``, ``"inf"`` and ``"-inf"``. The stored diagnosis, the MCP
server's answers and the TensorBoard tab's answers all write numbers this way.

Example:
    >>> json_safe({"loss": float("nan"), "steps": (1, 2)})
    {'loss': 'nan', 'steps': [1, 2]}
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


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


__all__ = ["json_safe"]
