"""Built-in rules with smdebug's names, parameters and defaults (reference/smdebug.md §4.7).

``BUILTIN_RULES`` maps each name to its class; lookups are case-insensitive (``rule_class``).
Third-party rules register through the ``mltrace.rules`` entry point group.
"""

from __future__ import annotations

import logging

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.rules.rule import Rule

logger = logging.getLogger(__name__)

BUILTIN_RULES: dict[str, type[Rule]] = {
    cls.__name__: cls
    for cls in (
        VanishingGradient,
    )
}
_entry_points_loaded = False


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="mltrace.rules"):
        try:
            BUILTIN_RULES.setdefault(ep.name, ep.load())
        except Exception as exc:
            logger.warning("rule plugin %s could not be loaded: %s", ep.name, exc)


def rule_class(name: str) -> type[Rule]:
    """The rule class called ``name`` (any case).

    Raises:
        MltraceValueError: unknown name, listing the known ones.
    """
    _load_entry_points()
    by_lower = {n.lower(): cls for n, cls in BUILTIN_RULES.items()}
    cls = by_lower.get(name.lower())
    if cls is None:
        raise MltraceValueError(
            f"unknown rule {name!r}; built-in rules are: {', '.join(sorted(BUILTIN_RULES))} "
            "(or pass --rule-file FILE for a rule of your own)"
        )
    return cls


__all__ = ["BUILTIN_RULES", "rule_class", *BUILTIN_RULES]
