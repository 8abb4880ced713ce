"""What the flight recorder keeps of a step (mltrace.capture.flight_recorder): which collections
it records, and the per-tensor path (``keep``) the hook and the frameworks' callbacks call.

``keep`` runs for every recorded tensor of every step, so how a name is kept is looked up once
and remembered until the collections' memberships change, and a plain tensor's way (its
reductions, no raw copy) is written out in ``keep`` itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from mltrace.capture.flight_recorder_state import (
    LOSS,
    PLAIN,
    RAW,
    SCALAR,
    SCALAR_ITEMS,
    UNKNOWN,
    WHOLE,
    RecordedStep,
    RecordedTensor,
    RecorderState,
)
from mltrace.capture.recorder_config import check_collections, entry_bytes
from mltrace.collections import SCALAR_COLLECTIONS, Collection, CollectionKeys
from mltrace.exceptions import MltraceTypeError
from mltrace.modes import ModeKeys
from mltrace.stability.samples import SAMPLES


class RecorderKeep(RecorderState):
    """The flight recorder's set-up of its collections and its per-step, per-tensor path."""

    def resolve(self, saved: Iterable[Collection], known: Mapping[str, Collection]) -> list[Collection]:
        """The recorded collections: those named in the config, else the saved ones; and the
        ``samples`` collection, if the hook has one and the config keeps samples.

        Raises:
            MltraceValueError: a named collection the hook does not have.
        """
        names = self.config.collections
        if names is None:
            colls = list(saved)
        else:
            check_collections(names, known)
            colls = [known[n] for n in names]
        samples = known.get(SAMPLES)
        if self.config.samples and samples is not None and samples not in colls:
            colls.append(samples)
        self.collections = frozenset(colls)
        self._how.clear()
        return colls

    def begin_step(self, step: int, mode: ModeKeys, mode_step: int, membership: int = 0) -> None:
        """Start recording ``step``. ``membership`` changes when the collections' memberships
        do (the hook's plan counts them): :meth:`keep` then looks its names up again."""
        self.current = RecordedStep(step, mode, mode_step, time.time()) if self.enabled else None
        if membership != self._membership:
            self._how.clear()
            self._membership = membership

    def records(self, colls: Iterable[Collection]) -> bool:
        """True if a tensor of ``colls`` is recorded this step."""
        return self.current is not None and any(c in self.collections for c in colls)

    def keeps(self, name: str) -> bool:
        """True if :meth:`keep` keeps something of the tensor ``name`` this step (a framework
        that computes a tensor for the recorder alone asks first)."""
        if self.current is None:
            return False
        how = self._how.get(name, UNKNOWN)
        if how is UNKNOWN:
            how = self._how[name] = self._kind(self.collections_of(name))[1]
        return how is not None

    def observe(self, name: str, value: Any, colls: Iterable[Collection]) -> None:
        """:meth:`keep`, with ``name``'s collections given (the hook's saving path has them):
        they are the plan's latest, so they also decide how :meth:`keep` keeps the name."""
        if self.current is None:
            return
        kind = self._kinds.get(name)
        if kind is None or kind[0] is not colls:  # the plan memoizes colls per name
            kind = self._kinds[name] = self._kind(colls)
        self._how[name] = kind[1]
        self.keep(name, value)

    def keep(self, name: str, value: Any) -> None:
        """Keep ``value``'s reductions (and a copy, if raw) for the current step, if a recorded
        collection holds ``name`` (looked up with ``collections_of``). Whatever reads ``value``
        happens now (it may change later). A framework callback calls this directly on a step
        that only records (see ``Hook.recording_only``), skipping the hook's saving path.

        It runs for every recorded tensor of every step, so a plain tensor's way is written out
        here (each Python call costs about a microsecond in place, next to a few for the
        reductions themselves), and how a name is kept is remembered until memberships change
        (see :meth:`begin_step`; a change within a step counts from the next)."""
        step = self.current
        if step is None:
            return
        how = self._how.get(name, UNKNOWN)
        if how is not PLAIN:  # most tensors are plain ones: their way first
            how = self._other_kind(step, name, value, how)
            if how is None:
                return
        try:
            started = self._reduce(value)  # None: not a value the recorder can keep
        except MltraceTypeError as exc:  # e.g. a quantized tensor: not recorded, said once
            self.adapter.warn_once(f"recorder:{name}", "flight recorder: not recording %s: %s", name, exc)
            return
        if started is None:
            return
        if how is PLAIN:
            step.started.append(started)
            step.tensors.append(name)
            step.size += self._width
            step.nbytes += self._tensor_bytes
        else:
            self._keep_reductions(step, name, started, self.adapter.snapshot(value))

    def _other_kind(self, step: RecordedStep, name: str, value: Any, how: str | None) -> str | None:
        """:meth:`keep` for a name not known as plain: looks it up (``UNKNOWN``) and keeps a
        scalar collection's value or a loss; the way left to :meth:`keep` (plain, or raw), or
        None when nothing more is to be done."""
        if how is UNKNOWN:
            how = self._how[name] = self._kind(self.collections_of(name))[1]
        if how is SCALAR or how is LOSS:
            if self.adapter.recordable(value):
                self._observe_scalar(step, name, value, how is LOSS)
            return None
        if how is WHOLE:
            snapshot = self.adapter.snapshot(value)
            step.whole.append((name, snapshot))
            step.nbytes += entry_bytes(0) + self.adapter.nbytes(snapshot)
            return None
        return how

    def _keep_reductions(self, step: RecordedStep, name: str, started: Any, raw: Any = None) -> None:
        """Add a tensor's reductions (the adapter's handle ``started``) and its raw copy, if
        any, to ``step``."""
        step.tensors.append(RecordedTensor(name, self.items, False, step.size, raw=raw))
        step.started.append(started)
        step.size += self._width
        step.nbytes += self._tensor_bytes + (self.adapter.nbytes(raw) if raw is not None else 0)

    def excuse_gradients(self, prefix: str) -> None:
        """Non-finite values of the current step's tensors named ``prefix...`` are expected
        (mixed precision: the loss scaler found them and skipped the optimizer step), so they
        trigger no dump; the step is still recorded as it was."""
        if self.current is not None:
            self.current.excused = prefix

    def _observe_scalar(self, step: RecordedStep, name: str, value: Any, loss: bool) -> None:
        """A scalar collection's tensor: one element is kept as its value (written raw, with its
        shape and dtype); more are reduced like any tensor."""
        shape, dtype = self.adapter.shape_and_dtype(value)
        if not all(d == 1 for d in shape):
            self._keep_reductions(step, name, self._reduce(value))
            return
        tensor = RecordedTensor(name, SCALAR_ITEMS, True, step.size, shape, dtype)
        started = self._reduce_scalar(value)
        step.tensors.append(tensor)
        step.started.append(started)
        if loss:
            step.losses.append((tensor, started))
        step.size += 1
        step.nbytes += entry_bytes(1)

    def _kind(self, colls: Any) -> tuple[Any, str | None]:
        """(colls, how a tensor of ``colls`` is kept: None if it is not recorded)."""
        recorded = [c for c in colls if c in self.collections]
        if not recorded:
            return colls, None
        if any(c.name == SAMPLES for c in colls):  # kept whole, or (samples=False) not at all
            return colls, WHOLE if self.config.samples else None
        if any(c.name == CollectionKeys.LOSSES for c in recorded):
            return colls, LOSS
        if any(c.name in SCALAR_COLLECTIONS for c in recorded):
            return colls, SCALAR
        return colls, RAW if self.config.raw else PLAIN
