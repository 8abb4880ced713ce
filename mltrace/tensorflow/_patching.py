"""Patching methods on the user's instances, and putting them back when the hook closes.

Capture points are methods set on the user's objects (an optimizer's ``apply``, a tape's
``gradient``, a layer's ``call``), never on their classes, so other instances are untouched;
each patch is recorded with what the instance had before, and :meth:`Patching.unpatch_all`
restores it.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

logger = logging.getLogger(__name__)

#: A patched attribute: (attribute name, whether the instance had its own, its old value).
_Patch = tuple[str, bool, Any]


class Patching:
    """The record of patched instance attributes (a mixin of the TensorFlow adapter)."""

    def __init__(self) -> None:
        super().__init__()
        self._restore: list[tuple[Any, str, bool, Any]] = []
        # Per-step objects (tapes) are patched weakly: a long loop must not keep every tape alive.
        self._weak_restore: weakref.WeakKeyDictionary[Any, list[_Patch]] = (
            weakref.WeakKeyDictionary()
        )

    def patch(self, obj: Any, attr: str, replacement: Any, weak: bool = False) -> None:
        """Set ``obj.attr`` on the instance (never on its class); ``unpatch_all`` restores it.
        ``weak``: for per-step objects (tapes), which the record must not keep alive."""
        entry = (attr, attr in vars(obj), vars(obj).get(attr))
        if weak:
            self._weak_restore.setdefault(obj, []).append(entry)
        else:
            self._restore.append((obj, *entry))
        setattr(obj, attr, replacement)

    def unpatch_all(self) -> None:
        """Undo every ``patch``, newest first."""
        weak = [(obj, *e) for obj, entries in list(self._weak_restore.items()) for e in entries]
        self._weak_restore.clear()
        for obj, attr, had, old in reversed(self._restore + weak):
            try:
                if had:
                    setattr(obj, attr, old)
                else:
                    delattr(obj, attr)
            except (AttributeError, TypeError):  # pragma: no cover - object already gone
                logger.debug("could not restore %s.%s", type(obj).__name__, attr)
        self._restore.clear()
