"""smdebug's hook API, shared by KerasHook and SessionHook: one constructor (smdebug's signature)
and explicit, typed methods and properties that delegate to the framework-neutral hook
(``hook.core``, a mltrace.capture.hook.Hook) and the TensorFlow adapter (``hook.adapter``).

KerasHook must be a ``tf.keras.callbacks.Callback`` and SessionHook a ``SessionRunHook``, so they
hold a core Hook instead of being one; this class is their common front.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Self, cast

from mltrace.capture.flight_recorder import FlightRecorder
from mltrace.capture.forwarding import Forwarded
from mltrace.capture.hook import Hook
from mltrace.capture.json_config import create_hook_from_config
from mltrace.capture.options import HookOptions
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import Collection as _CoreCollection
from mltrace.collections import CollectionManager
from mltrace.config import ReductionConfig, SaveConfig
from mltrace.modes import ModeKeys
from mltrace.tensorflow._core import TFAdapter, is_symbolic, take_pending
from mltrace.tensorflow.collection import DEFAULT_SAVED_COLLECTIONS, Collection
from mltrace.writer import TrialWriter
from mltrace.writer.tensorboard import TensorBoardWriter


class TFHookAPI:
    """The API every TensorFlow hook has (smdebug's "common hook API" and TensorFlow's own).

    Args: as smdebug's (out_dir, export_tensorboard, tensorboard_dir, dry_run, reduction_config,
    save_config, include_regex, include_collections, save_all, include_workers), plus ``strict``
    (raise mltrace's internal errors), ``saveall`` (Tornasole's spelling of save_all), ``mlflow``
    and ``stop_check_interval``; each is described in mltrace.capture.options.HookOptions.
    ``metrics``, ``losses`` and ``sm_metrics`` are always saved (as smdebug).
    ``flight_recorder`` keeps the last steps of chosen collections in memory, fetched on every
    step through the hook's own callbacks, and writes them when something goes wrong
    (mltrace.capture.flight_recorder).
    """

    #: Collections saved when ``include_collections`` names none (TornasoleHook: more).
    _default_include: ClassVar[tuple[str, ...]] = tuple(DEFAULT_SAVED_COLLECTIONS)
    #: The adapter class of this front door.
    _adapter_class: ClassVar[type[TFAdapter]] = TFAdapter
    #: The framework-neutral hook: steps, save plan, outputs, error policy.
    core: Hook
    #: The TensorFlow side: conversions, membership, capture points.
    adapter: TFAdapter

    def __init__(
        self,
        out_dir: str | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: Any = None,
        include_regex: str | Iterable[str] | None = None,
        include_collections: Iterable[str] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        strict: bool = False,
        saveall: bool | None = None,
        mlflow: bool | dict[str, Any] | None = None,
        stop_check_interval: float | None = None,
        flight_recorder: FlightRecorderConfig | dict[str, Any] | bool | None = None,
    ) -> None:
        super().__init__()  # the framework's base class (Keras Callback, SessionRunHook)
        options = HookOptions.from_front_door(locals())  # smdebug's arguments, by name
        self.adapter = self._adapter_class(self)
        self.core = Hook(options, self.adapter, collection_manager=take_pending(),
                         default_include_collections=self._default_include,
                         default_saved_collections=DEFAULT_SAVED_COLLECTIONS)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Self:
        """Build a hook from smdebug's JSON configuration (see mltrace.capture.json_config)."""
        return cast(Self, create_hook_from_config(cls, json_file_path))

    # -- collections ----------------------------------------------------------------------------
    def get_collection(self, name: str, create: bool = True) -> Collection:
        """The collection ``name`` (created if missing and ``create``)."""
        return cast(Collection, self.core.get_collection(name, create))

    def get_collections(self) -> dict[str, _CoreCollection]:
        """Every collection of this hook, by name."""
        return self.core.get_collections()

    def add_collection(self, collection: _CoreCollection) -> None:
        """Add a Collection built by the user (replacing one of the same name)."""
        self.core.add_collection(collection)

    def add_to_collection(self, collection_name: str, variable: Any) -> None:
        """``get_collection(collection_name).add(variable)``: a tf.Variable / keras.Variable, a
        graph tf.Tensor or tf.Operation, or a list of them (smdebug's hook method)."""
        self.adapter.add_to_collection(collection_name, variable)

    # -- modes and values -----------------------------------------------------------------------
    def set_mode(self, mode: ModeKeys | str) -> None:
        """Set the mode of the following steps (KerasHook's callbacks set it themselves)."""
        self.core.set_mode(mode)

    def save_scalar(self, name: str, value: Any, sm_metric: bool = False,
                    timestamp: float | None = None) -> None:
        """Save a scalar as ``scalar/<name>`` in the current step (see mltrace.capture.hook.Hook); after
        fit()/evaluate() ended, in a step of its own. Inside a tf.function, each time it runs."""
        if not is_symbolic(value):
            self.adapter.reopen_if_ended()
        self.core.save_scalar(name, value, sm_metric, timestamp)

    def save_tensor(self, tensor_name: str, tensor_value: Any,
                    collections_to_write: str | Iterable[str] = "default") -> None:
        """Save a tensor of your own into the named collections (created if needed), if one of
        them is due; after fit()/evaluate() ended, in a step of its own. Inside a tf.function,
        each time it runs."""
        if not is_symbolic(tensor_value):
            self.adapter.reopen_if_ended()
        self.core.save_tensor(tensor_name, tensor_value, collections_to_write)

    def record_tensor_value(self, tensor_name: str, tensor_value: Any) -> None:
        """Save a metric computed by the user (smdebug's README) as ``<tensor_name>`` in ``metrics``."""
        self.adapter.record_tensor_value(tensor_name, tensor_value)

    def dump_flight_recorder(self, reason: str = "asked by hand") -> None:
        """Write the flight recorder's steps to the trial now (between steps) or at the current
        step's end, then the next ``after_steps`` steps at full resolution (see
        mltrace.capture.hook.Hook.dump_flight_recorder).

        Raises:
            mltrace.exceptions.MltraceValueError: the hook has no flight recorder
                (``flight_recorder=FlightRecorderConfig(...)`` turns it on).
        """
        self.core.dump_flight_recorder(reason)

    def flush(self) -> None:
        """Write the current step's files and wait until they are stored (see
        mltrace.capture.hook.Hook.flush); fit/evaluate/predict and a session's end do it themselves."""
        self.core.flush()

    def close(self) -> None:
        """Write the last step and the end marker, and restore every patched object (see
        mltrace.capture.hook.Hook.close for what ``strict`` raises)."""
        self.core.close()

    # -- settings and state, read-only: the core hook's (mltrace.capture.hook.Hook) -----------------------
    out_dir = Forwarded[str]("core", "Where the trial is written.")
    dry_run = Forwarded[bool]("core", "Decide everything, write nothing.")
    strict = Forwarded[bool]("core", "Raise instead of going on.")
    save_all = Forwarded[bool]("core", "Save every tensor the hook sees.")
    include_workers = Forwarded[str]("core", '"one" (only the chief writes) or "all".')
    include_collections = Forwarded[list[str]]("core", "Names of the collections saved.")
    collection_manager = Forwarded[CollectionManager]("core", "This hook's collections.")
    save_config = Forwarded[SaveConfig](
        "core", "The hook's SaveConfig (used by collections that set none).")
    reduction_config = Forwarded[ReductionConfig](
        "core", "The hook's ReductionConfig (used by collections that set none).")
    tensorboard_dir = Forwarded[str | None]("core", "Where TensorBoard summaries go, or None.")
    writer = Forwarded[TrialWriter | None](
        "core", "The trial writer (None until the first step, in dry runs and on other workers).")
    tensorboard = Forwarded[TensorBoardWriter | None](
        "core", "The TensorBoard writer, if exporting.")
    sinks = Forwarded[list[Any]]("core", "The tracking sinks (MLflow).")
    disabled = Forwarded[bool](
        "core", "True after an internal error (the hook stopped saving; training went on).")
    closed = Forwarded[bool]("core", "True once close() ran.")
    step = Forwarded[int]("core", "The global step (-1 before the first).")
    mode = Forwarded[ModeKeys]("core", "The mode of the current step.")
    mode_steps = Forwarded[dict[ModeKeys, int]]("core", "Each mode's step.")
    worker = Forwarded[str]("core", "This process's worker name (known once the first step began).")
    num_workers = Forwarded[int](
        "core", "The number of workers of the job (known once the first step began).")
    recorder = Forwarded[FlightRecorder | None](
        "core", "The flight recorder (mltrace.capture.flight_recorder), if ``flight_recorder=`` "
        "asked for one (None in dry runs).")
    stop_requested = Forwarded[dict[str, Any] | None](
        "core", "A rule's stop signal (its rule, step and message), or None.")

    def __getstate__(self) -> dict[str, Any]:
        return {}  # as smdebug: a pickled hook carries nothing
