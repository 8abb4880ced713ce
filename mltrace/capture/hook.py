"""The framework-neutral hook: composes the capture core's parts behind smdebug's hook API.

A framework module builds a :class:`Hook` with its :class:`~mltrace.capture.adapter.Adapter`,
its collections and smdebug's defaults, then calls :meth:`Hook.begin_step` and
:meth:`Hook.save_for_tensor` from the framework's callbacks. The parts (see mltrace.capture):
settings (HookOptions), the step clock, the save plan, the NaN watch, the outputs (trial writer,
TensorBoard export, sinks), the stop signal and the error policy.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from mltrace._logging import configure_from_env
from mltrace.capture.adapter import Adapter, as_numpy
from mltrace.capture.carried import CarriedValues
from mltrace.capture.checkpoint import CheckpointState
from mltrace.capture.clock import StepClock
from mltrace.capture.errors import ErrorPolicy, guarded
from mltrace.capture.nan_watch import NanWatch
from mltrace.capture.options import HookOptions
from mltrace.capture.out_dir import OutDirGuard, open_out_dir
from mltrace.capture.outputs import Outputs
from mltrace.capture.plan import SavePlan
from mltrace.capture.quiet import QuietLane
from mltrace.capture.recording import Recording
from mltrace.capture.recording_adapter import RecordingAdapter
from mltrace.capture.stop import StopSignal
from mltrace.collections import Collection, CollectionManager
from mltrace.config import ReductionConfig, SaveConfig, name_list
from mltrace.exceptions import MltraceTypeError, MltraceValueError, StopTrainingRequested
from mltrace.format import paths
from mltrace.modes import ModeKeys
from mltrace.writer.tensorboard import resolve_tensorboard_dir

logger = logging.getLogger(__name__)

_current_hook: Hook | None = None

__all__ = ["Hook", "HookOptions", "Adapter", "get_hook", "set_hook", "del_hook", "hook_of_class",
           "guarded", "check_tensor_name", "as_numpy"]
_H = TypeVar("_H")


def get_hook() -> Hook | None:
    """The current hook of this process: the one created last, or given to ``set_hook``; None
    before any, or after ``del_hook()`` (smdebug's singleton)."""
    return _current_hook


def set_hook(hook: Any) -> None:
    """Make ``hook`` the current hook (smdebug's ``set_hook``): a framework hook, or a core Hook.

    Raises:
        MltraceTypeError: not a hook.
    """
    global _current_hook
    core = hook if isinstance(hook, Hook) else getattr(hook, "core", None)
    if not isinstance(core, Hook):
        raise MltraceTypeError(f"set_hook needs an mltrace hook (e.g. mltrace.pytorch.Hook), got "
                               f"{type(hook).__name__}")
    _current_hook = core


def del_hook() -> None:
    """Forget the current hook (smdebug's ``del_hook``), e.g. between two runs in one process.
    The hook itself is not closed: close it first to finish its trial."""
    global _current_hook
    _current_hook = None


def hook_of_class(hook_class: type[_H], front: Callable[[Hook], Any], json_config_path: str | None,
                  create_if_not_exists: bool) -> _H | None:
    """smdebug's framework ``get_hook``: the current hook if it is a ``hook_class`` (``front``
    maps the core hook to what the framework hands out); else, if ``create_if_not_exists``, a
    new ``hook_class`` from the JSON configuration (``json_config_path``, else the file the
    environment names), or None when there is no configuration (as smdebug).

    Raises:
        MltraceValueError: the configuration exists but is invalid.
    """
    current = _current_hook
    found = front(current) if current is not None else None
    if isinstance(found, hook_class):
        return found
    if not create_if_not_exists:
        return None
    try:
        return hook_class.create_from_json_file(json_config_path)  # type: ignore[attr-defined]
    except FileNotFoundError as exc:
        logger.info("get_hook(create_if_not_exists=True) creates no hook: %s", exc)
        return None


class Hook(QuietLane):
    """Saves tensors of a training job in smdebug's format.

    Args:
        options: the hook's settings (see HookOptions for each).
        adapter: the framework's side of the capture (default: numpy values, one process).
        collection_manager: the adapter's collections (default collections already registered).
        default_include_collections: collections saved when none are named.
        default_saved_collections: collections always saved (smdebug: losses for PyTorch).
        default_save_config: the adapter's SaveConfig when the user gives none.
    """

    def __init__(self, options: HookOptions, adapter: Adapter | None = None, *,
                 collection_manager: CollectionManager | None = None,
                 default_include_collections: Iterable[str] = (),
                 default_saved_collections: Iterable[str] = (),
                 default_save_config: SaveConfig | None = None) -> None:
        global _current_hook
        configure_from_env()  # MLTRACE_LOG_LEVEL, as smdebug read SMDEBUG_LOG_LEVEL in its hooks
        self.options = options
        self.adapter = adapter or RecordingAdapter()  # numpy values, which the recorder can keep
        self.errors = ErrorPolicy(options.strict, self._stop_saving)
        self.tensorboard_dir = resolve_tensorboard_dir(
            options.out_dir, options.export_tensorboard, options.tensorboard_dir)
        self.storage = open_out_dir(options.out_dir, self.tensorboard_dir, options.dry_run)
        self.plan = SavePlan.for_hook(options, collection_manager or CollectionManager(), default_include_collections,
                                      default_saved_collections, default_save_config,
                                      self.adapter.builtin_collections, self.adapter.is_member)
        self.save_config, self.reduction_config = self.plan.save_config, self.plan.reduction_config
        self.clock = StepClock()
        self.nan_watch = NanWatch()
        self.outputs = Outputs(self.storage, self.tensorboard_dir, options.strict, self.adapter, self.clock,
                               lambda: self.collection_manager.to_json(), OutDirGuard.of(self.storage, options.dry_run))
        self.stop = StopSignal(self.storage, options.stop_check_interval)
        #: The flight recorder (mltrace.capture.flight_recorder) and its links to the hook's parts, if asked for.
        self.recording = Recording.from_options(options, self.adapter, self.plan, self.stop, lambda: self.sinks,
                                                writing=lambda: not self._closed and not self.disabled)
        self.recorder = self.recording.recorder if self.recording is not None else None
        self.step_active = False  # the fast-path flag adapters test before doing any work
        self.recording_only: Recording | None = None  # the step is active only for it (adapters)
        self.step_written = False  # True once the current step's files are written (see end_step)
        self.take_quiet_step = self._quiet_lane()  # a quiet step in one call (False: call begin_step)
        self.worker, self.num_workers = paths.DEFAULT_WORKER_NAME, 1
        self.carried = CarriedValues()  # save_tensor values waiting for the next step
        self._closed = False
        #: smdebug's checkpoint support: steps continue after a restarted job's checkpoint.
        self.checkpoint = None if options.dry_run else CheckpointState.from_env()
        if options.sinks and not options.dry_run:
            self.outputs.add_sinks(options.sinks, self)
        self.adapter.attach(self)
        _current_hook = self
        atexit.register(_close_at_exit, weakref.ref(self))
        logger.info("mltrace hook writing to %s, saving collections %s", options.out_dir, self.include_collections)

    # -- settings, read-only views --------------------------------------------------------------
    out_dir = property(lambda self: self.options.out_dir, doc="Where the trial is written.")
    dry_run = property(lambda self: self.options.dry_run, doc="Decide everything, write nothing.")
    strict = property(lambda self: self.options.strict, doc="Raise instead of going on.")
    save_all = property(lambda self: self.options.save_all, doc="Save every tensor the hook sees.")
    include_workers = property(lambda self: self.options.include_workers, doc='"one" or "all".')
    mlflow = property(lambda self: self.options.mlflow, doc="The mlflow= option given.")
    collection_manager = property(lambda self: self.plan.manager, doc="This hook's collections.")
    include_collections = property(lambda self: self.plan.include_collections,
                                   doc="Names of the collections saved.")
    writer = property(lambda self: self.outputs.writer, doc="The trial writer (None until the first step).")
    tensorboard = property(lambda self: self.outputs.tensorboard, doc="The TensorBoard writer, if exporting.")
    sinks = property(lambda self: self.outputs.sinks, doc="The tracking sinks (MLflow).")
    disabled = property(lambda self: self.errors.disabled, doc="True after an internal error.")
    closed = property(lambda self: self._closed, doc="True once close() ran.")
    prepared = property(lambda self: self.plan.prepared, doc="True once the saved collections are fixed.")
    step = property(lambda self: self.clock.step, doc="The global step (-1 before the first).")
    mode = property(lambda self: self.clock.mode, doc="The mode of the current step.")
    mode_steps = property(lambda self: self.clock.mode_steps, doc="Each mode's step.")
    stop_requested = property(lambda self: self.stop.requested, doc="A rule's stop signal, or None.")

    # -- collections ----------------------------------------------------------------------------
    def get_collection(self, name: str, create: bool = True) -> Collection:
        """The collection ``name`` (created if missing and ``create``)."""
        return self.plan.adopt(self.collection_manager.get(name, create=create))

    def get_collections(self) -> dict[str, Collection]:
        """Every collection of this hook, by name."""
        return self.collection_manager.get_collections()

    def add_collection(self, collection: Collection) -> None:
        """Add a Collection built by the user (replacing one of the same name)."""
        self.collection_manager.add(self.plan.adopt(collection))
        if self.plan.prepared:
            self._prepare()

    # -- steps and modes ------------------------------------------------------------------------
    @guarded(user_facing=True)
    def set_mode(self, mode: ModeKeys | str) -> None:
        """Set the mode of the following steps (TRAIN, EVAL, PREDICT or GLOBAL)."""
        self.clock.set_mode(mode)

    def prepare(self) -> None:
        """Fix the saved collections and open the writer, if not done yet (the first step does it)."""
        if not self.plan.prepared:
            self._prepare()
            self._open_outputs()

    def _prepare(self) -> None:
        self.clock.quiet = 0
        self.adapter.on_prepare()
        self.plan.prepare()
        if self.recording is not None:
            self.recording.prepare()
        self.nan_watch.watched = self.plan.nan_watch
        self.adapter.on_prepared()

    def _open_outputs(self) -> None:
        self.worker, self.num_workers = self.adapter.worker_identity()
        chief = self.worker == self.adapter.chief_worker()
        if self.dry_run or not (self.include_workers == "all" or chief):
            return
        self.collection_manager.num_workers = self.num_workers if self.include_workers == "all" else 1
        self.outputs.open(self.worker, chief)
        if self.recording is not None:
            self.recording.opened(self.worker)

    def begin_step(self, step: int | None = None) -> None:
        """Close the previous step and start the next one: adapters call this at a step boundary.
        ``step`` (optional) sets the global and the mode's step to that number instead of counting
        up by one (as smdebug's XGBoost hook does); it must be above the current step."""
        if self.take_quiet_step(step, look=True):  # most steps: only counted (or recorded)
            return
        idle, self.clock.quiet = self.clock.counts_to(step) and self._idle(), 0
        if not idle:
            if self.strict:
                self.outputs.raise_write_failure()
            if not self.step_written:
                self.end_step()
            self.prepare()
            if self.checkpoint is not None:  # smdebug's checkpoint support (mltrace.capture.checkpoint)
                self.checkpoint.step_boundary(self.clock, counted=step is None, step_saved=self.step_active)
        self.clock.advance(step)
        due = self.decide_due()
        if not idle and not due and self.writer is not None:
            self.writer.hand_over()  # the steps just saved must not wait for more to batch with
        self.step_written = False
        if self.step_active or not idle:
            self.nan_watch.begin_step()
            self.outputs.begin_step(open_files=due)
        if self.writer is not None:
            self.stop.poll()
            if self.recording is not None:
                self.recording.begin_step(self.clock.step, self.clock.mode, self.clock.mode_step)
        if self.carried:
            for name, value, collections in self.carried.take():
                self._save_tensor(name, value, collections)
        self.adapter.on_step_begin()
        if (idle and not self.step_active) or (self.recording_only is not None and self._idle(True)):
            self.clock.quiet = self.plan.quiet_steps(self.clock.mode, self.clock.mode_step)

    def _idle(self, recorded: bool = False) -> bool:
        """True where only the clock moves (and the recorder, if ``recorded``): nothing written or waiting."""
        writer = self.writer
        return ((recorded or (not self.step_active and self.recording is None)) and writer is not None
                and not writer.step_open and not self.strict and self.checkpoint is None
                and not self.outputs.pending_scalars and not self.carried)

    def decide_due(self) -> bool:
        """Ask the plan what is due now (True if anything); set the adapters' fast-path flag."""
        due = self.plan.begin(self.clock.mode, self.clock.mode_step)
        recording = self.recording is not None and self.recording.active and self.writer is not None
        self.step_active = due or bool(self.plan.nan_watch) or recording
        self.recording_only = self.recording if recording and not due and not self.plan.nan_watch else None
        return due

    def end_step(self) -> None:
        """Write what the current step collected and close its files. Values saved after this and
        before the next step go to the next step (a written step cannot take more records)."""
        if not self.clock.started or self.writer is None:
            self.step_active = False
            return
        if self.step_active:  # else nothing was saved or watched (quiet: XGBoost's rounds)
            self.adapter.on_step_end()
            for name, array, colls in self.nan_watch.take(self.step):
                self.outputs.write_tensor(name, array, array, colls, on_host=True)
        if self.writer.step_open or self.outputs.pending_scalars:
            self._out_dir_replaced()
        if self.recording is not None and self.writer is not None:
            self.recording.end_step(self.outputs, self.writer)
        else:
            self.outputs.end_step()
        self.step_active = False
        self.step_written = True

    # -- saving ---------------------------------------------------------------------------------
    def save_for_tensor(self, name: str, value: Any) -> None:
        """Save ``value`` under ``name`` if a collection it belongs to is due this step (adapters
        call this from the framework's callbacks; ``value`` is a framework tensor)."""
        colls = self.plan.collections_of(name)
        if not colls:
            return
        due = self.plan.due_for(colls)
        if due:
            array = self.outputs.write_tensor(name, value, None, due)
            if array is not None:
                self.nan_watch.observe(name, array)
        elif self.plan.nan_watch:
            self.nan_watch.observe_unsaved(name, value, colls, self.clock.mode, self.adapter.to_numpy)
        recorder = self.recorder
        if recorder is not None and recorder.current is not None:
            recorder.observe(name, value, colls)

    @guarded(user_facing=True)
    def save_scalar(self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar as ``scalar/<name>`` in the current step (written at its end).

        Scalars also go to the tracking sinks (MLflow), whatever ``sm_metric`` says (smdebug
        sent ``sm_metric=True`` scalars to SageMaker Metrics).
        """
        check_tensor_name(name, "save_scalar name")
        self.clock.quiet = 0  # the step has something to write
        if self.adapter.defer_symbolic(lambda v: self.save_scalar(name, v, sm_metric, timestamp), value):
            return
        array = self.adapter.to_numpy(value)
        if array.size != 1:
            raise MltraceValueError(f"save_scalar({name!r}): value has {array.size} elements; pass one number")
        self.outputs.save_scalar(name, array, timestamp)

    @guarded(user_facing=True)
    def save_tensor(self, tensor_name: str, tensor_value: Any,
                    collections_to_write: str | Iterable[str] = "default") -> None:
        """Save a tensor of your own into the named collections (created if needed) this step,
        if one of them is due; after the step's files were written (see end_step), at the next."""
        check_tensor_name(tensor_name, "save_tensor name")
        self.clock.quiet = 0
        names = name_list("collections_to_write", collections_to_write, "collection name", "weights")
        if self.adapter.defer_symbolic(lambda v: self.save_tensor(tensor_name, v, names), tensor_value):
            return
        if self.step_written or not self.clock.started:
            # Saved with the next step (mltrace.capture.carried). The collections are made now, so
            # that naming one in include_collections and filling it only this way is valid.
            if not self.plan.prepared:
                self.plan.add_tensor(tensor_name, names)
            self.carried.hold(tensor_name, tensor_value, names, self.adapter.to_numpy)
            return
        self._save_tensor(tensor_name, tensor_value, names)

    def _save_tensor(self, tensor_name: str, tensor_value: Any, names: list[str]) -> None:
        if self.plan.add_tensor(tensor_name, names):
            self.decide_due()  # a collection saved from now on may be due this step
        if self.plan.prepared and self.clock.started:
            self.save_for_tensor(tensor_name, tensor_value)

    def add_sink(self, name: str, options: dict[str, Any]) -> None:
        """Start logging to a tracking sink (``"mlflow"``: the ``mlflow=`` options) once the hook
        exists, as trainer callbacks do when the trainer's MLflow run is open; earlier scalars stay
        in the trial, a dry run logs nowhere. Raises MltraceValueError: attached already, bad options."""
        self.options.add_sink(name, options)
        if not self.dry_run:
            self.outputs.add_sinks({name: options}, self)

    def stop_training_error(self) -> StopTrainingRequested:
        """Close the trial and return the exception that ends the user's loop (a rule asked)."""
        self.close()
        return self.stop.error()

    # -- lifecycle ------------------------------------------------------------------------------
    @guarded(user_facing=True)
    def flush(self) -> None:
        """Make the trial readable up to now: write the current step's files, the collections
        file and the TensorBoard summaries, and wait until they are on storage (hooks call this
        where training ends: Keras' on_train_end, XGBoost's after_training, the trainer callbacks).
        Values saved after it go to the next step; ``close()`` also marks the trial finished.
        With ``strict=True`` a file that could not be written raises TrialWriteError."""
        if self._closed or self.writer is None:
            return
        if self.clock.started and not self.step_written:
            self.end_step()
        if not self._out_dir_replaced():
            self.outputs.flush()
        if self.strict:
            self.outputs.raise_write_failure()

    @guarded(user_facing=True)
    def dump_flight_recorder(self, reason: str = "asked by hand") -> None:
        """Write the flight recorder's steps to the trial now (between steps) or at the current
        step's end, and the next ``after_steps`` steps at full resolution, as any trigger does.
        Raises MltraceValueError if the hook has no flight recorder."""
        if self.recording is None:
            raise MltraceValueError(
                "dump_flight_recorder: this hook has no flight recorder; pass "
                "flight_recorder=FlightRecorderConfig(steps=50) to the hook")
        self.recording.dump(reason, self.step_written or not self.step_active, self.writer)

    def _out_dir_replaced(self) -> bool:
        """True if the out_dir was deleted (and maybe made again for another run) since this hook
        began writing, or nothing is being written: then nothing more is (mltrace.capture.out_dir)."""
        if self.outputs.abandon_if_replaced(self.out_dir):
            self.step_active = False
        return self.writer is None

    def close(self) -> None:
        """Write the last step, the collections and the end marker; also runs at interpreter exit.
        With ``strict=True`` it raises a TrialWriteError not raised yet, or the first error of a
        sink's ``close()``, once everything else was written and closed."""
        if self._closed:
            return
        try:
            if not self.disabled:
                self._finish(write_end_marker=True)
        finally:
            self._closed = True
            self.outputs.guard.release()
            self.adapter.on_closed()
        if self.strict:
            self.outputs.raise_write_failure(closed=True)

    def _stop_saving(self, reason: str) -> None:
        """The error policy's reaction to an internal error: close what was written, no end marker."""
        self.step_active = False
        self._finish(write_end_marker=False)

    def _finish(self, write_end_marker: bool) -> None:
        try:
            if not self._out_dir_replaced():
                self.adapter.on_finish()
                if self.step_written and (self.outputs.pending_scalars or self.carried):
                    self.begin_step()  # saved after the last step's files: one step more
                self.end_step()
                if self.recording is not None and self.writer is not None:
                    self.recording.finish(self.writer)
            self.outputs.finish(write_end_marker)
        finally:
            # Sinks close last, also when nothing was written: they upload the trial's files
            # (MLflow artifacts), so those must be on storage first; and they end their runs.
            sink_error = self.outputs.close_sinks()
            if not write_end_marker:
                self.adapter.on_closed()
        if sink_error is not None and self.strict:
            raise sink_error

    def __getstate__(self) -> dict[str, Any]:
        return {}  # as smdebug: a pickled hook (DataLoader workers, multiprocessing) carries nothing

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.errors = ErrorPolicy(False, lambda reason: None)
        self.errors.disabled = True
        self._closed = True
        self.step_active = False


def _close_at_exit(ref: weakref.ref[Hook]) -> None:
    """Close a hook still alive at interpreter exit (the end marker makes its trial complete)."""
    hook = ref()
    if hook is not None:
        hook.close()


def check_tensor_name(name: Any, what: str = "tensor name") -> str:
    """Return ``name`` if it can name a tensor in a trial, else raise naming the fix.

    Any non-empty ``str`` that UTF-8 can encode is kept exactly ('/', '..', newlines and NUL
    included): names live inside the events and index files, never in file paths. Lone
    surrogates (e.g. from ``os.fsdecode`` of undecodable bytes) cannot be stored.

    Raises:
        MltraceTypeError: not a str.
        MltraceValueError: empty, or not encodable as UTF-8.
    """
    if not isinstance(name, str):
        raise MltraceTypeError(f"{what} {name!r} is of type {type(name).__name__}: pass a str, e.g. 'loss'")
    if not name:
        raise MltraceValueError(f"{what} is empty: pass a non-empty str, e.g. 'loss'")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MltraceValueError(
            f"{what} {name!r} cannot be stored as UTF-8 ({exc.reason} at index {exc.start}): remove "
            "that character, e.g. name.encode('utf-8', 'replace').decode()"
        ) from None
    return name


# The hook's reduction configuration type, re-exported for adapters' signatures.
__all__ += ["ReductionConfig"]
