"""Values given to ``save_tensor`` between steps, saved with the next step.

Before the first step (a config tensor, an input sample, an initial state logged before the
loop) and after a step's files were written, a value has no open step to go into. smdebug queued
such values and wrote them with the next step; so does mltrace. They are copied to the host at
once: the caller may change the array before the next step begins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceTypeError

logger = logging.getLogger("mltrace.capture.hook")


class CarriedValues:
    """The values waiting for the next step: name -> (host copy, collection names)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[np.ndarray, list[str]]] = {}

    def __bool__(self) -> bool:
        return bool(self.values)

    def hold(self, name: str, value: Any, collections: list[str],
             to_numpy: Callable[[Any], np.ndarray]) -> None:
        """Keep a host copy of ``value`` for the next step (the last one given under a name
        wins); a value that is not an array is skipped with a warning, as at a step."""
        try:
            self.values[name] = (np.array(to_numpy(value), copy=True, subok=True), collections)
        except MltraceTypeError as exc:
            logger.warning("not saving tensor %r: %s", name, exc)

    def take(self) -> list[tuple[str, np.ndarray, list[str]]]:
        """The waiting values, in the order given; none wait afterwards."""
        values, self.values = self.values, {}
        return [(name, value, collections) for name, (value, collections) in values.items()]


__all__ = ["CarriedValues"]
