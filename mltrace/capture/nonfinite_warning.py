"""The training log's word on a NaN or an infinity: the hook warns once per run when a value it
saves is not finite, naming the tensor and the step, with no rule and no flight recorder.

It looks only at values already on the host for writing: losses, scalars and other small raw
values (at most MAX_CHECKED_ELEMENTS elements: a larger raw tensor would cost a pass over its
memory, so it is seen through its reductions, when saved), and the step's reductions, which the
hook copies to the host together at the step's end (one ``isfinite`` over that one array). No
device work, no copy; a finite step costs one vectorised check per batch of values. The first
step with a non-finite value gets one warning that names its first such tensor, the step (and
mode step), and how many others were not finite there; later steps are only counted, and close
logs the count (at INFO): a run whose every tensor turns NaN never floods the log. The check
never raises into training: an error in it is logged at DEBUG and the value is taken as finite.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mltrace.capture.clock import StepClock
from mltrace.format.tensors import BFloat16Bits
from mltrace.reductions import as_numeric, parse_reduction_tensor_name

logger = logging.getLogger("mltrace.capture.hook")

#: Raw values up to this many elements are checked (losses, scalars, small tensors).
MAX_CHECKED_ELEMENTS = 4096
#: Tensors named in the warning (the rest are counted).
NAMED = 5


def _kind(values: np.ndarray) -> str:
    """"NaN", "+inf", "-inf" or a mix, for an array that holds a non-finite value."""
    kinds = []
    if np.isnan(values).any():
        kinds.append("NaN")
    if np.isposinf(values).any():
        kinds.append("+inf")
    if np.isneginf(values).any():
        kinds.append("-inf")
    return " and ".join(kinds) or "not finite"


def _what(record: str, kind: str) -> tuple[str, str]:
    """(tensor, what was not finite) of a record: ``("gradient/x", "l2 NaN")`` for a stored
    reduction of ``gradient/x``, ``("loss", "NaN")`` for a raw value."""
    parsed = parse_reduction_tensor_name(record)
    if parsed is None:
        return record, kind
    base, reduction, is_abs = parsed
    return base, f"{'abs_' if is_abs else ''}{reduction} {kind}"


class NonFiniteWarning:
    """What the hook saved this step that was not finite, and whether the run warned already.

    Args:
        max_elements: raw values larger than this are not checked.
    """

    def __init__(self, max_elements: int = MAX_CHECKED_ELEMENTS) -> None:
        self.max_elements = max_elements
        #: (tensor, what was not finite) found in the current step, in the order written.
        self.found: list[tuple[str, str]] = []
        #: set by the first step with a non-finite value: (tensor, global step, mode, mode step).
        self.first: tuple[str, int, str, int] | None = None
        #: steps with a non-finite value, the first included.
        self.steps = 0
        self.last_step: int | None = None
        self._seen = False  # the current step has a non-finite value (after the warning)
        self._masks: dict[int, tuple[Sequence[bool], np.ndarray | None]] = {}

    def _add(self, name: str, values: np.ndarray) -> None:
        if self.first is None:
            self.found.append(_what(name, _kind(values)))
        self._seen = True

    def check(self, name: str, array: np.ndarray) -> None:
        """Look at one raw value the hook writes (skipped past ``max_elements``)."""
        try:
            kind = array.dtype.kind
            if (kind in "biu" and type(array) is not BFloat16Bits) or array.size > self.max_elements:
                return
            if kind == "f" and array.size == 1:
                if math.isfinite(array.item()):
                    return
            elif kind == "f" and type(array) is np.ndarray:  # the usual raw value: no conversion
                if np.isfinite(array).all():
                    return
            else:
                array = as_numeric(array)
                if array.dtype.kind not in "fc" or np.isfinite(array).all():
                    return
            self._add(name, np.asarray(array))
        except Exception as exc:  # never into training
            logger.debug("non-finite check of %r failed: %s", name, exc)

    def check_records(self, records: Sequence[tuple[str, np.ndarray]]) -> None:
        """Look at several small host records (reductions, an adapter's computed values): one
        sum of their values first (a finite sum: all finite, the usual step), each record only
        when it is not (or a record has several elements, or bfloat16 bits)."""
        try:
            total = sum([a.item() if type(a) is not BFloat16Bits else math.nan for _, a in records])
            if math.isfinite(total):
                return
        except (ValueError, TypeError):  # a record of several elements, a complex value
            pass
        except Exception as exc:  # never into training
            logger.debug("non-finite check of %d records failed: %s", len(records), exc)
            return
        for name, array in records:
            self.check(name, array)

    def check_block(self, started: Sequence[tuple[str, Sequence[Any], Any]],
                    integer: Sequence[bool], flat: np.ndarray) -> None:
        """Look at a step's reductions as the one host array the hook writes (``flat``, in the
        order of ``started``'s tensors and their reductions; ``integer`` marks the counts, whose
        ``nan_count``/``inf_count`` above zero also tell of a non-finite value)."""
        try:
            mask = self._count_mask(integer)
            if np.isfinite(flat).all() and (mask is None or not flat[mask].any()):
                return
            if self.first is not None:  # only counted after the warning: no names to make
                self._seen = True
                return
            bad = ~np.isfinite(flat)
            if mask is not None:
                bad |= mask & (flat > 0)
            owners = [(name, red) for name, items, _ in started for red in items]
            for i in np.flatnonzero(bad).tolist():
                name, (reduction, is_abs) = owners[i]
                what = f"{'abs_' if is_abs else ''}{reduction}"
                value = flat[i : i + 1]
                kind = str(int(value[0])) if integer[i] else _kind(value)
                self.found.append((name, f"{what} {kind}"))
            self._seen = True
        except Exception as exc:  # never into training
            logger.debug("non-finite check of the step's reductions failed: %s", exc)

    def _count_mask(self, integer: Sequence[bool]) -> np.ndarray | None:
        """Which of a block's values are counts (None: none), kept per list of ``integer`` (the
        hook keeps one list per set of tensors, the same object step after step)."""
        entry = self._masks.get(id(integer))
        if entry is None or entry[0] is not integer:
            if len(self._masks) >= 32:
                self._masks.clear()
            mask = np.asarray(integer, dtype=bool)
            entry = self._masks[id(integer)] = (integer, mask if mask.any() else None)
        return entry[1]

    def end_step(self, clock: StepClock) -> None:
        """The step's values are all written: warn if it is the run's first non-finite step."""
        if not self._seen:
            return
        self._seen = False
        self.steps += 1
        self.last_step = clock.step
        if self.first is not None or not self.found:
            self.found.clear()
            return
        found, self.found = self.found, []
        tensors: dict[str, list[str]] = {}  # each tensor once, in the order written
        for name, what in found:
            tensors.setdefault(name, []).append(what)
        (name, whats), *others = tensors.items()
        mode = clock.mode.name
        self.first = (name, clock.step, mode, clock.mode_step)
        also = ""
        if others:
            listed = ", ".join(f"{n} ({', '.join(w)})" for n, w in others[:NAMED])
            more = f" and {len(others) - NAMED} more" if len(others) > NAMED else ""
            also = f"; also not finite at that step: {listed}{more}"
        logger.warning(
            "mltrace: a non-finite value was saved at step %d (%s step %d): %s (%s)%s. Training "
            "goes on; later non-finite steps are counted, not logged (the count comes at close). "
            "To see where it began: `mltrace diagnose <out_dir>`, or a flight recorder.",
            clock.step, mode, clock.mode_step, name, ", ".join(whats), also)

    def summarize(self) -> None:
        """At close: how many steps saved a non-finite value (nothing if none did)."""
        if self.first is None:
            return
        name, step, mode, mode_step = self.first
        logger.info("mltrace: %d step(s) saved a non-finite value, from step %d (%s step %d, %s) "
                    "to step %s", self.steps, step, mode, mode_step, name, self.last_step)


__all__ = ["MAX_CHECKED_ELEMENTS", "NonFiniteWarning"]
