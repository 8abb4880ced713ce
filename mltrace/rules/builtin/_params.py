"""Parsing rule parameters: every built-in rule accepts strings (as SageMaker passed them)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys, mode_from

if TYPE_CHECKING:
    from mltrace.trials import Trial


def as_float(rule: str, name: str, value: Any, low: float | None = None, high: float | None = None,
             inclusive: bool = True) -> float:
    """A float parameter, from a number or a string, optionally within [low, high] (or the open
    interval when not ``inclusive``)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise MltraceValueError(f"{rule}: parameter {name}={value!r} must be a number") from None
    if low is not None or high is not None:
        check_range(rule, name, number, low, high, inclusive)
    return number


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


def _is_none(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("", "none", "null")
    return value is None


def as_optional_float(rule: str, name: str, value: Any) -> float | None:
    """A float parameter that may be unset: None, "" or "None" give None."""
    return None if _is_none(value) else as_float(rule, name, value)


def as_optional_int(rule: str, name: str, value: Any) -> int | None:
    """An int parameter that may be unset: None, "" or "None" give None."""
    return None if _is_none(value) else as_int(rule, name, value)


def as_optional_str(value: Any) -> str | None:
    """A string parameter that may be unset: None, "" or "None" give None."""
    return None if _is_none(value) else str(value).strip()


def as_regex_list(rule: str, name: str, value: Any) -> list[str]:
    """Regexes: a list, or a comma-separated string (so a regex given as a string cannot itself
    contain a comma; pass a list for that). Each is compiled to check it."""
    items = [] if _is_none(value) else as_list(value)
    for item in items:
        try:
            re.compile(item)
        except re.error as exc:
            raise MltraceValueError(
                f"{rule}: parameter {name}={item!r} is not a valid regular expression ({exc})"
            ) from None
    return items


def as_float_list(rule: str, name: str, value: Any) -> list[float]:
    """Numbers: a list, or a comma-separated string; brackets and parentheses are ignored, so
    "(-9.5, 9.5)" and "[1, 2]" work too."""
    if isinstance(value, str):
        value = value.strip().strip("()[]")
    return [as_float(rule, name, v) for v in as_list(value)]


def as_range(rule: str, name: str, value: Any) -> tuple[float, float]:
    """A (low, high) pair, from a tuple or a string such as "(-9.4999, 9.4999)"."""
    pair = as_float_list(rule, name, value)
    if len(pair) != 2 or not pair[0] < pair[1]:
        raise MltraceValueError(
            f"{rule}: parameter {name}={value!r} must be a pair (low, high) with low < high"
        )
    return pair[0], pair[1]


def as_mode(rule: str, name: str, value: Any) -> ModeKeys | None:
    """A mode name ("train", "EVAL", ...) or ModeKeys; None, "" or "None" give None."""
    if _is_none(value):
        return None
    try:
        return mode_from(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise MltraceValueError(
            f"{rule}: parameter {name}={value!r} must be one of train, eval, predict, global"
        ) from None


def check_range(rule: str, name: str, value: float, low: float | None = None,
                high: float | None = None, inclusive: bool = True) -> float:
    """Check that ``value`` lies within [low, high] (or (low, high) when not inclusive)."""
    bad = ((low is not None and (value < low if inclusive else value <= low))
           or (high is not None and (value > high if inclusive else value >= high)))
    if bad:
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        interval = f"[{lo}, {hi}]" if inclusive else f"({lo}, {hi})"
        raise MltraceValueError(f"{rule}: parameter {name}={value!r} must lie in {interval}")
    return value


def as_names(value: Any) -> list[str]:
    """Names (e.g. collections): a list or a comma-separated string; None, "" or "None" give []."""
    return [] if _is_none(value) else as_list(value)


def as_trial(rule: str, name: str, value: Any) -> Trial | None:
    """A trial parameter: a Trial, or a path/URI opened with create_trial; None stays None."""
    from mltrace.trials import Trial, create_trial  # the reader imports rules' parents lazily

    if _is_none(value):
        return None
    if isinstance(value, Trial):
        return value
    if isinstance(value, str):
        return create_trial(value.strip())
    raise MltraceValueError(
        f"{rule}: parameter {name}={value!r} must be a trial (create_trial(path)) or a path"
    )
