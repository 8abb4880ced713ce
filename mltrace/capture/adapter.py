"""The protocol between the capture core and a framework.

A framework adapter (``mltrace.pytorch``, ``mltrace.tensorflow``, ``mltrace.mxnet``,
``mltrace.xgboost``) subclasses :class:`Adapter` and fills in what differs per framework:

1. who this process is: :meth:`Adapter.worker_identity`, :meth:`Adapter.chief_worker`;
2. how a framework tensor becomes host bytes and reductions: :meth:`Adapter.to_numpy`,
   :meth:`Adapter.reduce` (on the tensor's device, moving only the scalars to the host);
3. how it attaches to the framework: the adapter installs the framework's callbacks itself and
   calls the hook's ``begin_step`` and ``save_for_tensor`` from them; the hook tells it about
   its own life through the ``on_*`` events below.

Every method has a default that fits host (numpy) values, so an adapter overrides only what its
framework needs. The hook never calls anything else of an adapter, and adapters override
nothing of the hook. What only the flight recorder asks of an adapter is an interface of its
own, :class:`mltrace.capture.recording_adapter.RecordingAdapter`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from mltrace.capture.errors import ErrorPolicy
from mltrace.collections import Collection, CollectionKeys
from mltrace.exceptions import MltraceTypeError
from mltrace.format import paths
from mltrace.writer.histogram_bins import Binned

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook

#: (reduction name, of the absolute value) pairs, as ReductionConfig.items() gives them.
ReductionItems = list[tuple[str, bool]]


class Adapter:
    """What a framework supplies to the capture core (defaults: a single process, numpy values)."""

    #: Collections that may be empty when the first step starts (the adapter fills them);
    #: any other collection without regexes or names is a configuration error.
    builtin_collections: frozenset[str] = frozenset({CollectionKeys.ALL, CollectionKeys.DEFAULT})

    def __init__(self) -> None:
        #: The hook this adapter serves, set by ``attach`` when the hook is built.
        self.hook: Hook | None = None
        #: The hook's error policy (``@guarded`` callbacks of the adapter use it).
        self.errors = ErrorPolicy(False, lambda reason: None)
        self._warned: set[str] = set()

    def attach(self, hook: Hook) -> None:
        """Bind to ``hook``; the hook calls this at the end of its construction."""
        self.hook = hook
        self.errors = hook.errors

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """Log ``message % args`` as a warning the first time ``key`` is seen (on the logger of
        the adapter's module, so a framework's warnings can be filtered by its name)."""
        if key not in self._warned:
            self._warned.add(key)
            logging.getLogger(type(self).__module__).warning(message, *args)

    # -- identity ---------------------------------------------------------------------------------
    def worker_identity(self) -> tuple[str, int]:
        """(this process's worker name, the number of workers), asked when the first step starts."""
        return paths.DEFAULT_WORKER_NAME, 1

    def chief_worker(self) -> str:
        """The worker that writes when ``include_workers="one"``."""
        return paths.DEFAULT_WORKER_NAME

    # -- values -----------------------------------------------------------------------------------
    def to_numpy(self, value: Any) -> np.ndarray:
        """A host numpy copy of ``value``.

        Raises:
            mltrace.exceptions.MltraceTypeError: a value the framework cannot turn into numpy
                (the hook then skips that tensor with one warning).
        """
        return as_numpy(value)

    def reduce(self, value: Any, items: ReductionItems) -> list[np.ndarray | None]:
        """Reductions ``items`` of ``value`` (None where a reduction has no value, e.g. empty
        tensors), by mltrace.reductions' definitions; adapters compute them on the device."""
        from mltrace.reductions import compute

        array = self.to_numpy(value)
        return [compute(name, array, abs_) for name, abs_ in items]

    def reduce_on_device(self, value: Any, items: ReductionItems) -> Any:
        """Start the reductions ``items`` of ``value`` where the value lives and return a handle;
        :meth:`reductions_to_host` turns a step's handles into results together, so an adapter
        on an accelerator moves them to the host in one transfer per step instead of one per
        tensor. Whatever reads ``value`` happens here: the caller may change it afterwards (an
        optimizer updates weights in place). Default: the results, computed at once.
        """
        return self.reduce(value, items)

    def bins_on_device(self, value: Any) -> bool:
        """True if :meth:`device_histogram` bins ``value`` where it lives (an accelerator's
        tensor); otherwise its TensorBoard histogram is binned from a host copy."""
        return False

    def device_histogram(self, value: Any) -> Binned | None:
        """The histogram of ``value`` binned on its device, only the counts copied to the host
        (mltrace.writer.histogram_bins' buckets); None if it has no finite value."""
        raise NotImplementedError(f"{type(self).__name__} bins no histogram on a device")

    def reductions_to_host_flat(self, started: list[Any]) -> np.ndarray | None:
        """The results of a step's :meth:`reduce_on_device` handles ``started`` as one float64
        array, in their order, when the adapter has them in one go and every one has a value
        (the writer then encodes them as one block); None otherwise, and by default: then
        :meth:`reductions_to_host`."""
        return None

    def reductions_to_host(self, started: list[Any]) -> list[list[np.ndarray | None]]:
        """The results of the :meth:`reduce_on_device` handles ``started``, in their order (as
        :meth:`reduce` returns them)."""
        return list(started)

    def is_member(self, collection: Collection, name: str) -> bool:
        """True if the tensor ``name`` belongs to ``collection`` (default: its names and regexes)."""
        return collection.matches(name)

    def defer_symbolic(self, save: Callable[[Any], None], value: Any) -> bool:
        """For graph frameworks: if ``value`` exists only while a graph runs, arrange for
        ``save(value)`` to be called each time it runs and return True; else return False."""
        return False

    # -- events from the hook ---------------------------------------------------------------------
    def on_prepare(self) -> None:
        """The saved collections are about to be fixed (before the first step): resolve names."""

    def on_prepared(self) -> None:
        """The saved collections are fixed: keep only the framework callbacks they can use."""

    def on_step_begin(self) -> None:
        """A step began (``hook.step_active`` says whether anything is due)."""

    def on_step_end(self) -> None:
        """The current step is about to be written: save what is read at the boundary."""

    def on_finish(self) -> None:
        """The hook is closing (also when disabled): save what is only known at the end."""

    def on_closed(self) -> None:
        """The hook closed or disabled itself: undo what was attached to the user's objects."""


def as_numpy(value: Any) -> np.ndarray:
    """smdebug's conversion of host values: arrays as they are, Python and numpy scalars as
    shape [1], lists and tuples through np.asarray.

    Raises:
        mltrace.exceptions.MltraceTypeError: anything else.
    """
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (int, float, bool, complex, np.generic)):
        return np.array([value])
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    raise MltraceTypeError(
        f"cannot save a value of type {type(value).__name__}: pass a numpy array, a number, a "
        "list, or a tensor of the hook's framework"
    )
