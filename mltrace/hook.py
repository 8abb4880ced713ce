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
import os
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from mltrace._logging import configure_from_env
from mltrace.capture.adapter import Adapter, as_numpy
from mltrace.capture.checkpoint import CheckpointState
from mltrace.capture.clock import StepClock
from mltrace.capture.errors import ErrorPolicy, guarded
from mltrace.capture.flight_recorder import FlightRecorder, check_collections, watch_exceptions
from mltrace.capture.nan_watch import NanWatch
from mltrace.capture.options import HookOptions
from mltrace.capture.out_dir import OutDirGuard
from mltrace.capture.outputs import Outputs
from mltrace.capture.plan import SavePlan
from mltrace.capture.stop import StopSignal
from mltrace.collections import Collection, CollectionKeys, CollectionManager
from mltrace.config import ReductionConfig, SaveConfig, name_list
from mltrace.exceptions import (
    MltraceRuntimeError,
    MltraceTypeError,
    MltraceValueError,
    StopTrainingRequested,
)
from mltrace.format import SCALAR_PREFIX, paths
from mltrace.modes import ModeKeys
from mltrace.storage import open_storage
from mltrace.tensorboard_export import resolve_tensorboard_dir

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


class Hook:
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
        self.adapter = adapter or Adapter()
        self.errors = ErrorPolicy(options.strict, self._stop_saving)
        self.tensorboard_dir = resolve_tensorboard_dir(
            options.out_dir, options.export_tensorboard, options.tensorboard_dir)
        if self.tensorboard_dir:
            open_storage(self.tensorboard_dir)  # a location no backend handles fails here, clearly
        self.storage = open_storage(options.out_dir)
        self._check_out_dir()
        self.save_config = options.hook_save_config(default_save_config)
        self.reduction_config = options.hook_reduction_config()
        self.plan = SavePlan(collection_manager or CollectionManager(),
                             self._included(options, default_include_collections, default_saved_collections),
                             self.save_config, self.reduction_config,
                             self.adapter.builtin_collections, self.adapter.is_member)
        self._include_special_collections(options)
        self.clock = StepClock()
        self.nan_watch = NanWatch()
        self.outputs = Outputs(self.storage, self.tensorboard_dir, options.strict, self.adapter,
                               self.clock, lambda: self.collection_manager.to_json())
        self.stop = StopSignal(self.storage, options.stop_check_interval)
        #: The flight recorder (mltrace.capture.flight_recorder), if the options ask for one.
        self.recorder = self._make_recorder(options)
        self.step_active = False  # the fast-path flag adapters test before doing any work
        #: True once the current step's files are written (see end_step).
        self.step_written = False
        self.worker, self.num_workers = paths.DEFAULT_WORKER_NAME, 1
        #: save_tensor values waiting for the next step: name -> (value, collections).
        self._carried: dict[str, tuple[np.ndarray, list[str]]] = {}
        self._closed = False
        self.out_dir_guard = OutDirGuard(
            None if options.dry_run else os.path.dirname(self.storage.local_path(paths.END_OF_JOB_MARKER) or "")
            or None)
        #: smdebug's checkpoint support: steps continue after a restarted job's checkpoint.
        self.checkpoint = None if options.dry_run else CheckpointState.from_env()
        if options.sinks and not options.dry_run:
            from mltrace import plugins  # entry points are read only by hooks that log somewhere

            self.outputs.sinks.extend(plugins.create_sink(name, self, sink_options)
                                      for name, sink_options in options.sinks.items())
        self.adapter.attach(self)
        _current_hook = self
        atexit.register(_close_at_exit, weakref.ref(self))
        logger.info("mltrace hook writing to %s, saving collections %s", options.out_dir, self.include_collections)

    def _make_recorder(self, options: HookOptions) -> FlightRecorder | None:
        config = options.flight_recorder
        if config is None or options.dry_run:
            return None
        assert not isinstance(config, (dict, bool))
        if config.collections is not None:
            check_collections(config.collections, self.collection_manager.get_collections())
        recorder = FlightRecorder(config, self.adapter)
        recorder.on_dump = self._tell_sinks_of_dump
        self.stop.watch_dump_requests = True
        if config.on_exception:
            watch_exceptions(self)
        return recorder

    def _check_out_dir(self) -> None:
        if self.options.dry_run:
            return
        check_local_out_dir(self.options.out_dir, self.storage.local_path(paths.END_OF_JOB_MARKER))
        if self.storage.exists(paths.END_OF_JOB_MARKER):
            raise MltraceRuntimeError(
                f"out_dir {self.options.out_dir!r} holds a finished run ({paths.END_OF_JOB_MARKER} "
                "exists): use a new out_dir, or delete that one to overwrite it")

    @staticmethod
    def _included(options: HookOptions, default_include: Iterable[str], always: Iterable[str]) -> list[str]:
        names = list(default_include) if options.include_collections is None else list(options.include_collections)
        return names + list(always)

    def _include_special_collections(self, options: HookOptions) -> None:
        if options.include_regex:
            self.collection_manager.get(CollectionKeys.DEFAULT).include(options.include_regex)
            self.plan.include(CollectionKeys.DEFAULT)
        if options.save_all:
            self.collection_manager.get(CollectionKeys.ALL).include(".*")
            self.plan.include(CollectionKeys.ALL)

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
        self.adapter.on_prepare()
        self.plan.prepare()
        if self.recorder is not None:
            self.plan.watch(self.recorder.resolve(self.plan.saved,
                                                  self.collection_manager.get_collections()))
        self.nan_watch.watched = self.plan.nan_watch
        self.adapter.on_prepared()

    def _open_outputs(self) -> None:
        self.worker, self.num_workers = self.adapter.worker_identity()
        chief = self.worker == self.adapter.chief_worker()
        if self.dry_run or not (self.include_workers == "all" or chief):
            return
        self.collection_manager.num_workers = self.num_workers if self.include_workers == "all" else 1
        self.out_dir_guard.claim()
        self.outputs.open(self.worker, chief)
        if self.recorder is not None:
            self.recorder.worker = self.recorder.record.worker = self.worker

    def begin_step(self, step: int | None = None) -> None:
        """Close the previous step and start the next one: adapters call this at a step boundary.

        ``step`` (optional) sets the global step and the current mode's step to that number
        instead of counting up by one, as smdebug's XGBoost hook does. It must be above the
        current step.
        """
        if self.strict:
            self.outputs.raise_write_failure()
        if not self.step_written:
            self.end_step()
        self.prepare()
        if self.checkpoint is not None:
            self._checkpoint_boundary(counted=step is None)
        self.clock.advance(step)
        due = self._decide_due()
        self.step_written = False
        self.nan_watch.begin_step()
        self.outputs.begin_step(open_files=due)
        if self.writer is not None:
            self.stop.poll()
            if self.recorder is not None:
                self._begin_recording()
        carried, self._carried = self._carried, {}
        for name, (value, collections) in carried.items():
            self._save_tensor(name, value, collections)
        self.adapter.on_step_begin()

    def _checkpoint_boundary(self, counted: bool) -> None:
        """smdebug's checkpoint support (mltrace.capture.checkpoint): before the first counted
        step, continue a restarted job's steps; between steps, record the state when a new
        checkpoint appeared. Steps numbered by the framework (XGBoost's rounds) keep them."""
        assert self.checkpoint is not None
        if self.step_active and self.clock.started:
            self.checkpoint.last_saved_step = self.clock.step
        if self.checkpoint.to_restore and not self.clock.started:
            if counted:
                self.checkpoint.restore(self.clock)
            self.checkpoint.to_restore = False
            return
        self.checkpoint.at_boundary(self.clock)

    def _decide_due(self) -> bool:
        """Ask the save plan what is due at the current step; set the adapters' fast-path flag
        (also on for the NaN watch and a flight recorder, which look at every step). True if
        something is due."""
        due = self.plan.begin(self.clock.mode, self.clock.mode_step)
        recording = self.recorder is not None and self.recorder.enabled and self.writer is not None
        self.step_active = due or bool(self.plan.nan_watch) or recording
        return due

    def _begin_recording(self) -> None:
        assert self.recorder is not None
        request, self.stop.dump_request = self.stop.dump_request, None
        if request is not None:
            asked = f"rule {request.rule}" if request.rule else "mltrace dump"
            self.recorder.trigger("rule" if request.rule else "manual",
                                  f"{asked} asked for a dump" + (f": {request.reason}" if request.reason else ""))
        self.recorder.begin_step(self.clock.step, self.clock.mode, self.clock.mode_step)

    def end_step(self) -> None:
        """Write what the current step collected and close its files. Values saved after this and
        before the next step go to the next step (a written step cannot take more records)."""
        if not self.clock.started or self.writer is None:
            self.step_active = False
            return
        if self.step_active:
            self.adapter.on_step_end()
        held = self.nan_watch.take()
        if held:
            logger.info("NaN seen at step %d: saving %d watched tensors", self.step, len(held))
        for name, array, colls in held:
            self.outputs.write_tensor(name, array, array, colls, on_host=True)
        if (self.writer.step_open or self.outputs.pending_scalars) and self.out_dir_guard.replaced():
            self._leave_replaced_out_dir()
        recorder = self.recorder if self.writer is not None else None
        if recorder is not None:
            self.outputs.write_pending()  # the step's own reductions first: the recorder's skip them
            # a step the hook writes itself takes the recorder's records now (a dump must
            # never write it again: that would replace its file and lose what it saved)
            recorder.end_step(self.outputs.write_records, saved=self.writer.step_open)
        self.outputs.end_step()
        if recorder is not None:
            recorder.dump_pending(self.writer)
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
            self._watch_nan(name, value, colls)
        recorder = self.recorder
        if recorder is not None and recorder.current is not None:
            recorder.observe(name, value, colls)

    def _watch_nan(self, name: str, value: Any, colls: tuple[Collection, ...]) -> None:
        saving = self.nan_watch.saving_on_nan(colls, self.clock.mode)
        if name not in self.nan_watch.watched and not saving:
            return
        array = self.adapter.to_numpy(value)
        self.nan_watch.observe(name, array)
        if saving:
            self.nan_watch.hold(name, array, saving)

    @guarded(user_facing=True)
    def save_scalar(self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar as ``scalar/<name>`` in the current step (written at its end).

        Scalars also go to the tracking sinks (MLflow), whatever ``sm_metric`` says (smdebug
        sent ``sm_metric=True`` scalars to SageMaker Metrics).
        """
        check_tensor_name(name, "save_scalar name")
        if self.adapter.defer_symbolic(lambda v: self.save_scalar(name, v, sm_metric, timestamp), value):
            return
        array = self.adapter.to_numpy(value)
        if array.size != 1:
            raise MltraceValueError(f"save_scalar({name!r}): value has {array.size} elements; pass one number")
        self.outputs.pending_scalars.append((SCALAR_PREFIX + name, array, timestamp))
        if self.sinks:
            self.outputs.log_to_sinks(name, float(array.reshape(-1)[0]), max(self.clock.mode_step, 0))

    @guarded(user_facing=True)
    def save_tensor(self, tensor_name: str, tensor_value: Any,
                    collections_to_write: str | Iterable[str] = "default") -> None:
        """Save a tensor of your own into the named collections (created if needed) this step,
        if one of them is due; after the step's files were written (see end_step), at the next."""
        check_tensor_name(tensor_name, "save_tensor name")
        names = name_list("collections_to_write", collections_to_write, "collection name", "weights")
        if self.adapter.defer_symbolic(lambda v: self.save_tensor(tensor_name, v, names), tensor_value):
            return
        if self.step_written or not self.clock.started:
            # Before the first step (smdebug queued these too) or after the step's files were
            # written: saved with the next step. The collections are made now, so that naming
            # one in include_collections and filling it only this way is valid.
            if not self.plan.prepared:
                for cname in names:
                    self.get_collection(cname).add_tensor_name(tensor_name)
                    self.plan.include(cname)
            try:  # a copy: the caller may change the array before the next step
                self._carried[tensor_name] = (
                    np.array(self.adapter.to_numpy(tensor_value), copy=True, subok=True), names)
            except MltraceTypeError as exc:
                logger.warning("not saving tensor %r: %s", tensor_name, exc)
            return
        self._save_tensor(tensor_name, tensor_value, names)

    def _save_tensor(self, tensor_name: str, tensor_value: Any, names: list[str]) -> None:
        added = False
        for cname in names:
            coll = self.get_collection(cname)
            coll.add_tensor_name(tensor_name)
            added = self.plan.add_saved(coll) or added
        self.plan.forget(tensor_name)
        if added:
            self._decide_due()  # a collection saved from now on may be due this step
        if self.plan.prepared and self.clock.started:
            self.save_for_tensor(tensor_name, tensor_value)

    def add_sink(self, name: str, options: dict[str, Any]) -> None:
        """Start logging to a tracking sink (``"mlflow"``: the ``mlflow=`` options) after the
        hook was built: trainer callbacks (mltrace.transformers, mltrace.lightning) attach MLflow
        once the trainer's own MLflow logger has opened the run they share. Scalars saved before
        are in the trial only. A dry run logs nowhere.

        Raises:
            mltrace.exceptions.MltraceValueError: the sink is attached already, or bad options.
        """
        if name in self.options.sinks:
            raise MltraceValueError(f"the hook logs to {name!r} already; add a sink once")
        self.options.sinks[name] = dict(options)
        if name == "mlflow":
            self.options.mlflow = dict(options) or True
        if self.dry_run:
            return
        from mltrace import plugins

        self.outputs.sinks.append(plugins.create_sink(name, self, dict(options)))

    def stop_training_error(self) -> StopTrainingRequested:
        """Close the trial and return the exception that ends the user's loop (a rule asked)."""
        self.close()
        return self.stop.error()

    # -- lifecycle ------------------------------------------------------------------------------
    @guarded(user_facing=True)
    def flush(self) -> None:
        """Make the trial readable up to now: write the current step's files, the collections
        file and the TensorBoard summaries, and wait until they are on storage. Hooks call this
        where training ends (Keras' on_train_end, a tf.compat.v1 session's end, XGBoost's
        after_training, the Transformers and Lightning callbacks); values saved after it go to
        the next step. ``close()`` does all this and also marks the trial finished.

        Raises:
            mltrace.exceptions.TrialWriteError: with ``strict=True``, a file that could not be
                written.
        """
        if self._closed or self.writer is None:
            return
        if self.clock.started and not self.step_written:
            self.end_step()
        if self.writer is None:  # end_step found the out_dir replaced
            return
        if self.out_dir_guard.replaced():
            self._leave_replaced_out_dir()
            return
        self.outputs.write_collections()
        self.writer.flush()
        if self.tensorboard is not None:
            self.tensorboard.flush()
        if self.strict:
            self.outputs.raise_write_failure()

    def check_recorder_budget(self, tensors: Iterable[tuple[str, int]]) -> None:
        """Adapters call this with the tensors they know before training ((name, bytes): a
        model's parameters and gradients): a flight recorder whose budget cannot hold one step
        of those is a configuration error, raised to the user (mltrace.capture.flight_recorder).

        Raises:
            mltrace.exceptions.MltraceValueError: the budget is too small for one step.
        """
        if self.recorder is None:
            return
        names = self.recorder.config.collections or self.plan.include_collections
        known = self.collection_manager.get_collections()
        colls = [known[n] for n in names if n in known]
        self.recorder.check_budget(tensors, lambda name: any(self.adapter.is_member(c, name) for c in colls))

    @guarded(user_facing=True)
    def dump_flight_recorder(self, reason: str = "asked by hand") -> None:
        """Write the flight recorder's steps to the trial now (between steps) or at the current
        step's end, and the next ``after_steps`` steps at full resolution, as any trigger does.

        Raises:
            mltrace.exceptions.MltraceValueError: the hook has no flight recorder.
        """
        if self.recorder is None:
            raise MltraceValueError(
                "dump_flight_recorder: this hook has no flight recorder; pass "
                "flight_recorder=FlightRecorderConfig(steps=50) to the hook")
        if self.recorder.trigger("manual", str(reason)) and (self.step_written or not self.step_active):
            self.recorder.dump_pending(self.writer)

    def flight_recorder_exception(self, reason: str) -> None:
        """An exception escaped the training script (see watch_exceptions): dump at the
        current step's end, which closing the hook at exit writes."""
        if self.recorder is not None and not self._closed and not self.disabled:
            self.recorder.trigger("exception", reason)

    def _tell_sinks_of_dump(self, record: Any, dump: Any) -> None:
        """Sinks that show dumps (MLflow's tags) hear of each; a sink's failure is logged."""
        for sink in self.sinks:
            told = getattr(sink, "flight_recorder_dumped", None)
            if told is None:
                continue
            try:
                told(record, dump)
            except Exception as exc:
                if self.strict:
                    raise
                logger.error("sink %r could not record the flight recorder's dump: %s", sink, exc)

    def _leave_replaced_out_dir(self) -> None:
        """The out_dir was deleted (and maybe made again for another run) since this hook began
        writing: write nothing more there (see mltrace.capture.out_dir)."""
        logger.warning(
            "out_dir %s was deleted or replaced since this hook began writing into it: the hook "
            "writes nothing more there (not its last steps, not the end marker), so another run's "
            "trial in that folder stays intact. Close a hook (hook.close()) before reusing its "
            "out_dir.", self.out_dir)
        writer, tensorboard = self.writer, self.tensorboard
        self.outputs.writer = self.outputs.tensorboard = None
        self.outputs.pending_scalars.clear()
        self.step_active = False
        if writer is not None:
            writer.discard()
        if tensorboard is not None:
            tensorboard.discard()

    def close(self) -> None:
        """Write the last step, the collections and the end marker; also runs at interpreter exit.

        Raises:
            mltrace.exceptions.TrialWriteError: with ``strict=True``, a file that could not be
                written and was not raised yet (everything else was still written and closed).
            Exception: with ``strict=True``, the first error of a sink's ``close()`` (every sink
                was still closed).
        """
        if self._closed:
            return
        writer, tensorboard = self.writer, self.tensorboard
        try:
            if not self.disabled:
                self._finish(write_end_marker=True)
        finally:
            self._closed = True
            self.out_dir_guard.release()
            self.adapter.on_closed()
        if self.strict:
            for failed in (writer, tensorboard):
                failure = failed.failures.take() if failed is not None else None
                if failure is not None:
                    raise failure

    def _stop_saving(self, reason: str) -> None:
        """The error policy's reaction to an internal error: close what was written, no end marker."""
        self.step_active = False
        self._finish(write_end_marker=False)

    def _finish(self, write_end_marker: bool) -> None:
        try:
            if self.writer is not None and self.out_dir_guard.replaced():
                self._leave_replaced_out_dir()
            if self.writer is not None:
                self.adapter.on_finish()
                if self.step_written and (self.outputs.pending_scalars or self._carried):
                    self.begin_step()  # saved after the last step's files: one step more
                self.end_step()
                if self.recorder is not None and self.writer is not None:
                    self.recorder.dump_pending(self.writer)  # a dump asked for after the last step
                    self.recorder.write_record(self.writer)
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
        # As smdebug: a pickled hook (DataLoader workers, multiprocessing) carries nothing.
        return {}

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


def check_local_out_dir(out_dir: str, marker_path: str | None) -> None:
    """Fail at construction, not at the first write, when a local out_dir cannot hold a trial:
    it (or the nearest existing folder above it) is a file, or this process may not write there.
    ``marker_path`` is a file's path inside out_dir (None for remote storage: not checked)."""
    if marker_path is None:
        return
    root = probe = os.path.dirname(marker_path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = "is a file" if probe == root else f"is inside {probe!r}, which is a file"
        raise MltraceValueError(f"out_dir {out_dir!r} {where}: pass the path of a directory (new or existing)")
    effective = os.access in os.supports_effective_ids
    if not os.access(probe, os.W_OK | os.X_OK, effective_ids=effective):
        raise MltraceValueError(
            f"out_dir {out_dir!r} cannot be written: this process (uid {os.geteuid()}) may not create "
            f"files in {probe!r}; pass a directory you can write to, or fix its permissions"
        )


# The hook's reduction configuration type, re-exported for adapters' signatures.
__all__ += ["ReductionConfig"]
