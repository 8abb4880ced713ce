"""Parsing rule parameters: every built-in rule accepts strings (as SageMaker passed them)."""

from __future__ import annotations

from typing import Any

from mltrace.exceptions import MltraceValueError


def as_float(rule: str, name: str, value: Any) -> float:
    """A float parameter, from a number or a string."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise MltraceValueError(f"{rule}: parameter {name}={value!r} must be a number") from None


def as_int(rule: str, name: str, value: Any) -> int:
    """An int parameter, from a number or a string."""
    try:
        number = float(value)
        if number != int(number):
            raise ValueError
        return int(number)
    except (TypeError, ValueError):
        raise MltraceValueError(f"{rule}: parameter {name}={value!r} must be an integer") from None


def as_bool(rule: str, name: str, value: Any) -> bool:
    """A bool parameter: True/False or the strings true/false (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise MltraceValueError(f"{rule}: parameter {name}={value!r} must be true or false")


def as_list(value: Any) -> list[str]:
    """A list parameter: a list, or a comma-separated string; None gives []."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]
