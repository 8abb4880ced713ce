"""Saving on NaN (SaveConfigMode ``when_nan``): tensors of collections that save on NaN are held
(as host copies) through a step that is not due, and written only if a watched tensor turned NaN.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from mltrace.collections import Collection
from mltrace.modes import ModeKeys

logger = logging.getLogger("mltrace.capture.hook")


class NanWatch:
    """The watched tensor names, whether one of them was NaN this step, and the held values."""

    def __init__(self) -> None:
        self.watched: frozenset[str] = frozenset()
        #: True once a watched tensor held a NaN in the current step.
        self.seen = False
        self.held: list[tuple[str, np.ndarray, tuple[Collection, ...]]] = []

    def begin_step(self) -> None:
        """Forget the previous step's NaN (its held values were written or dropped)."""
        self.seen = False

    def observe(self, name: str, array: np.ndarray) -> None:
        """Note a NaN if ``name`` is watched and ``array`` holds one."""
        if name in self.watched and array.dtype.kind in "fc" and bool(np.isnan(array).any()):
            self.seen = True

    def saving_on_nan(self, colls: Iterable[Collection], mode: ModeKeys) -> tuple[Collection, ...]:
        """Those of ``colls`` whose save config for ``mode`` saves on NaN."""
        return tuple(c for c in colls if c.effective_save_config().get_save_config(mode).when_nan)

    def observe_unsaved(self, name: str, value: Any, colls: tuple[Collection, ...], mode: ModeKeys,
                        to_numpy: Callable[[Any], np.ndarray]) -> None:
        """A tensor of ``colls`` in a step that does not save them: look at it if it is watched,
        and hold it if one of its collections saves on NaN (copied to the host only then)."""
        saving = self.saving_on_nan(colls, mode)
        if name not in self.watched and not saving:
            return
        array = to_numpy(value)
        self.observe(name, array)
        if saving:
            self.hold(name, array, saving)

    def hold(self, name: str, array: np.ndarray, colls: tuple[Collection, ...]) -> None:
        """Keep ``array`` until the step ends, to be written to ``colls`` if a NaN shows up."""
        self.held.append((name, array, colls))

    def take(self, step: int) -> list[tuple[str, np.ndarray, tuple[Collection, ...]]]:
        """The held values to write at the end of ``step`` (none unless a NaN was seen); clears
        them."""
        held, self.held = self.held, []
        if not (self.seen and held):
            return []
        logger.info("NaN seen at step %d: saving %d watched tensors", step, len(held))
        return held
