"""The framework-neutral hook: steps and modes, collection matching, save decisions, writing.

Adapters (mltrace.pytorch, ...) subclass BaseHook and supply four things: how to turn a framework
tensor into numpy (``_to_numpy``), how to compute reductions on the device (``_reduce``), the
worker's name and count, and the callbacks that call ``_begin_step`` / ``_save_for_tensor``.
Everything else, the save rules of smdebug included, lives here once.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import importlib
import json
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from mltrace.collections import (
    METRIC_COLLECTIONS,
    NON_REDUCTION_COLLECTIONS,
    SCALAR_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
)
from mltrace.config import ReductionConfig, SaveConfig, config_generation, name_list
from mltrace.exceptions import (
    InvalidCollectionConfiguration,
    MltraceError,
    MltraceRuntimeError,
    MltraceTypeError,
    MltraceValueError,
    StopTrainingRequested,
)
from mltrace.format import SCALAR_PREFIX, paths
from mltrace.modes import ModeKeys, mode_from
from mltrace.reductions import reduction_tensor_name
from mltrace.storage import open_storage
from mltrace.tensorboard_export import TensorBoardWriter, clean_tag, resolve_tensorboard_dir
from mltrace.writer import TrialWriter

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

_current_hook: BaseHook | None = None


def get_hook() -> BaseHook | None:
    """The hook created last in this process (smdebug's ``get_hook``), or None."""
    return _current_hook


def guarded(default: Any = None) -> Callable[[F], F]:
    """Wrap a method called from the user's training loop: an internal error is logged once and
    disables the hook, so training goes on (unless the hook was built with ``strict=True``).

    Failures outside mltrace's own code are not internal errors and keep the hook saving: a file
    that cannot be written (full disk; see mltrace.writer) and a sink that raises are logged
    once, and the next steps are tried again."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: BaseHook, *args: Any, **kwargs: Any) -> Any:
            if self._disabled:
                return default
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                # The user's mistakes (bad arguments, a collection that matches nothing) raise;
                # mltrace's own failures disable the hook so that training goes on.
                user_error = isinstance(exc, (InvalidCollectionConfiguration, StopTrainingRequested)) or (
                    isinstance(exc, MltraceError) and fn.__name__ in _USER_FACING
                )
                if self.strict or user_error:
                    raise
                self._disable(f"{fn.__name__}: {type(exc).__name__}: {exc}")
                return default

        return wrapper  # type: ignore[return-value]

    return decorate


# Methods whose invalid arguments are the user's to fix: they raise instead of disabling.
_USER_FACING = frozenset({
    "save_scalar", "save_tensor", "set_mode", "record_tensor_value", "register_module", "register_loss",
})


class BaseHook:
    """Saves tensors of a training job in smdebug's format.

    Args:
        out_dir: local directory (or URI of an installed storage backend) for the trial.
        export_tensorboard: also write TensorBoard summaries (scalars of losses and metrics,
            histograms of collections with save_histogram) to ``<out_dir>/tensorboard/<MODE>/``.
        tensorboard_dir: where TensorBoard summaries go (implies the export).
        dry_run: decide everything but write no file.
        reduction_config: default ReductionConfig of collections that set none.
        save_config: default SaveConfig (a SaveConfig, SaveConfigMode or {mode: SaveConfigMode}).
        include_regex: regexes added to the ``default`` collection, which is then saved.
        include_collections: names of collections to save (the default-saved ones are added).
        save_all: save every tensor the hook sees (collection ``all``).
        include_workers: "one" (only the chief writes) or "all".
        strict: raise instead of going on: an internal error of mltrace (which otherwise
            disables the hook), a file that could not be written (a TrialWriteError, from the
            next step boundary after the background write failed, or from ``close()``; without
            strict the failure is logged once and the next steps are written as usual, so a
            disk that gets space again gets them), and a sink's error (otherwise logged once
            per sink). Files kept in the spill folder during an S3 outage are not errors.
        mlflow: log to MLflow too: True (the active run, or a new one), or a dict of options
            for mlflow_plugin (``experiment``, ``run_name``, ``tracking_uri``, ``run_id``).
        stop_check_interval: seconds between looks for a rule's stop signal (never per step).
        collection_manager: the adapter's collections (default collections already registered).
        default_include_collections: collections saved when none are named.
        default_saved_collections: collections always saved (smdebug: losses for PyTorch).
    """

    def __init__(
        self,
        out_dir: str,
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
        mlflow: bool | dict[str, Any] | None = None,
        stop_check_interval: float | None = None,
        *,
        collection_manager: CollectionManager,
        default_include_collections: Iterable[str],
        default_saved_collections: Iterable[str],
        default_save_config: SaveConfig | None = None,
    ) -> None:
        global _current_hook
        if not out_dir:
            raise MltraceValueError("out_dir is required: the directory the trial is written to")
        #: where TensorBoard summaries go (None: no export); see mltrace.tensorboard_export.
        self.tensorboard_dir = resolve_tensorboard_dir(out_dir, export_tensorboard, tensorboard_dir)
        if self.tensorboard_dir:
            open_storage(self.tensorboard_dir)  # a location no backend handles fails here, clearly
        if include_workers not in ("one", "all"):
            raise MltraceValueError(f"include_workers={include_workers!r} must be 'one' or 'all'")
        if reduction_config is not None and not isinstance(reduction_config, ReductionConfig):
            raise MltraceValueError(f"reduction_config={reduction_config!r} must be a ReductionConfig")
        self.out_dir = out_dir
        self.dry_run = bool(dry_run)
        self.strict = bool(strict)
        self.include_workers = include_workers
        self.save_all_workers = include_workers == "all"
        self.save_config = SaveConfig.parse(save_config) if save_config is not None else (
            default_save_config.copy() if default_save_config else SaveConfig())
        self.reduction_config = reduction_config or ReductionConfig(save_raw_tensor=True)
        self.collection_manager = collection_manager
        self.storage = open_storage(out_dir)
        if not self.dry_run:
            _check_local_out_dir(out_dir, self.storage.local_path(paths.END_OF_JOB_MARKER))
        if not self.dry_run and self.storage.exists(paths.END_OF_JOB_MARKER):
            raise MltraceRuntimeError(
                f"out_dir {out_dir!r} holds a finished run ({paths.END_OF_JOB_MARKER} exists): "
                "use a new out_dir, or delete that one to overwrite it"
            )

        self.default_saved_collections = list(default_saved_collections)
        names = list(default_include_collections) if include_collections is None else (
            name_list("include_collections", include_collections, "collection name", "weights"))
        self.include_collections = list(dict.fromkeys(names + self.default_saved_collections))
        self.save_all = bool(save_all)
        if include_regex:
            self.collection_manager.get(CollectionKeys.DEFAULT).include(include_regex)
            if CollectionKeys.DEFAULT not in self.include_collections:
                self.include_collections.append(CollectionKeys.DEFAULT)
        if self.save_all:
            self.collection_manager.get(CollectionKeys.ALL).include(".*")
            if CollectionKeys.ALL not in self.include_collections:
                self.include_collections.append(CollectionKeys.ALL)
        for coll in self.collection_manager.get_collections().values():
            self._adopt(coll)

        # Step state (smdebug: callback hooks start at -1 so that the first step is 0).
        self.step = -1
        self.mode = ModeKeys.GLOBAL
        self.mode_steps: dict[ModeKeys, int] = {m: -1 for m in ModeKeys}
        self._prepared = False
        self._collections_to_save: list[Collection] = []
        self._tensor_collections: dict[str, tuple[Collection, ...]] = {}
        self._due: frozenset[Collection] = frozenset()
        self.step_active = False  # fast-path flag adapters test before doing any work
        self._written_this_step: set[str] = set()
        self._pending_scalars: list[tuple[str, np.ndarray, float | None]] = []
        self._nan_watch: set[str] = set()
        self._nan_buffer: list[tuple[str, np.ndarray, tuple[Collection, ...]]] = []
        self._nan_seen = False
        self._unsupported: set[str] = set()
        self._warned_missing: set[str] = set()  # include_collections names already warned about
        self._rules_key: tuple[Any, ...] | None = None
        self._rules_cache: dict[ModeKeys, list[tuple[Collection, Any]]] = {}
        self._disabled = False
        self._closed = False
        self._collections_exported = False
        self.worker = "worker_0"
        self.num_workers = 1
        self.writer: TrialWriter | None = None
        self.tensorboard: TensorBoardWriter | None = None
        self._step_mode = ModeKeys.GLOBAL
        self.sinks: list[Any] = []
        self._sink_errors: dict[int, int] = {}  # id(sink) -> errors so far (the first is logged)
        self.stop_requested: dict[str, Any] | None = None
        # Local trials are checked every second; remote ones every 5 s (one request each time).
        self.stop_check_interval = stop_check_interval if stop_check_interval is not None else (
            1.0 if self.storage.local_path(paths.STOP_SIGNAL_FILE) else 5.0)
        self._next_stop_check = 0.0
        self.mlflow = mlflow
        if mlflow and not self.dry_run:
            self.sinks.append(_load_sink("mlflow", self, mlflow))
        _current_hook = self
        ref = weakref.ref(self)
        atexit.register(lambda: (h := ref()) is not None and h.close())
        logger.info("mltrace hook writing to %s, saving collections %s", out_dir, self.include_collections)

    # -- collections ----------------------------------------------------------------------------
    def _adopt(self, coll: Collection) -> None:
        coll._inherited_save_config = self.save_config
        coll._inherited_reduction_config = self.reduction_config

    def get_collection(self, name: str, create: bool = True) -> Collection:
        """The collection ``name`` (created if missing and ``create``)."""
        coll = self.collection_manager.get(name, create=create)
        self._adopt(coll)
        return coll

    def get_collections(self) -> dict[str, Collection]:
        """Every collection of this hook, by name."""
        return self.collection_manager.get_collections()

    def add_collection(self, collection: Collection) -> None:
        """Add a Collection built by the user (replacing one of the same name)."""
        self.collection_manager.add(collection)
        self._adopt(collection)
        if self._prepared:
            self._prepared = False
            self._prepare_collections()

    def _prepare_collections(self) -> None:
        """Fix what is saved, before the first step (collections may be added until then)."""
        defaults = self._builtin_collection_names()
        saving_all = CollectionKeys.ALL in self.include_collections
        self._collections_to_save = []
        for name, coll in self.collection_manager.get_collections().items():
            self._adopt(coll)
            if name not in defaults and not coll.include_regex and not coll.tensor_names:
                usable = [n for n, c in self.collection_manager.get_collections().items()
                          if n != name and (c.include_regex or c.tensor_names)]
                raise InvalidCollectionConfiguration(
                    name, did_you_mean=next(iter(difflib.get_close_matches(name, usable, n=1)), None))
            try:  # lists changed in place (config.reductions.append) were never checked
                coll.effective_reduction_config().validate()
            except MltraceValueError as exc:
                raise InvalidCollectionConfiguration(name, f"collection {name!r}: {exc}") from None
            if name in NON_REDUCTION_COLLECTIONS:
                coll.save_histogram = False
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)
            if saving_all or name in self.include_collections:
                self._collections_to_save.append(coll)
        self._warn_missing_collections()
        self._tensor_collections.clear()
        self._nan_watch = set().union(*(c.effective_save_config().watched_nan_tensors()
                                        for c in self._collections_to_save)) | self.save_config.watched_nan_tensors()
        self._prepared = True
        logger.info("Monitoring the collections: %s", ", ".join(c.name for c in self._collections_to_save))

    def _warn_missing_collections(self) -> None:
        """One warning (per name) for include_collections names that no collection has when the
        first step starts. A warning, not an error: smdebug users may still fill such a
        collection later, with ``hook.save_tensor(name, value, collections_to_write=...)``."""
        known = self.collection_manager.collections
        missing = [n for n in self.include_collections if n not in known and n not in self._warned_missing]
        if not missing:
            return
        self._warned_missing.update(missing)
        hints = "".join(f" Did you mean {close[0]!r} for {n!r}?" for n in missing
                        if (close := difflib.get_close_matches(n, list(known), n=1)))
        logger.warning(
            "include_collections names %s, but no collection of that name existed when the first "
            "step started, so nothing is saved for it.%s Known collections: %s. Create a collection "
            "before training with hook.get_collection(name).include(regex); "
            "hook.save_tensor(tensor_name, value, collections_to_write=name) also creates one later.",
            missing, hints, ", ".join(sorted(known)))

    def _builtin_collection_names(self) -> set[str]:
        return {CollectionKeys.ALL, CollectionKeys.DEFAULT}

    def _collections_of(self, name: str) -> tuple[Collection, ...]:
        """The saved collections ``name`` belongs to (memoized; records the name in them)."""
        found = self._tensor_collections.get(name)
        if found is None:
            found = tuple(c for c in self._collections_to_save if c.matches(name))
            for c in found:
                c.add_tensor_name(name)
            self._tensor_collections[name] = found
        return found

    # -- steps and modes ------------------------------------------------------------------------
    @guarded()
    def set_mode(self, mode: ModeKeys | str) -> None:
        """Set the mode of the following steps (TRAIN, EVAL, PREDICT or GLOBAL)."""
        self.mode = mode_from(mode)

    def _begin_step(self, step: int | None = None) -> None:
        """Close the previous step and start the next one: adapters call this at a step boundary.

        ``step`` (optional) sets the global step and the current mode's step to that number
        instead of counting up by one, as smdebug's XGBoost hook does (step = boosting round,
        also when training resumes from a saved model). It must be above the current step.
        """
        if step is not None and step <= self.step:
            raise MltraceValueError(f"_begin_step(step={step}): steps only go up; the current step is {self.step}")
        if self.strict:
            self._raise_write_failure(self.writer, self.tensorboard)
        self._end_step()
        if not self._prepared:
            self._prepare_collections()
            self._open_writer()
        if step is not None:
            self.step = self.mode_steps[self.mode] = step - 1
        self.step += 1
        self.mode_steps[self.mode] += 1
        if self.mode is not ModeKeys.GLOBAL:
            self.mode_steps[ModeKeys.GLOBAL] = self.step
        mode_step = self.mode_steps[self.mode]
        self._step_mode = self.mode  # the run its TensorBoard summaries go to, even after set_mode
        due = [coll for coll, rule in self._save_rules(self.mode) if rule.should_save_step(mode_step)]
        self._due = frozenset(due)
        self._written_this_step.clear()
        self._nan_seen = False
        self.step_active = bool(due) or bool(self._nan_watch)
        if self.writer is not None and (due or self._nan_watch):
            self.writer.open_step(self.step, self.mode, mode_step)
        if self.writer is not None and self.stop_requested is None:
            self._check_stop_signal()

    def _save_rules(self, mode: ModeKeys) -> list[tuple[Collection, Any]]:
        """(collection, its SaveConfigMode for ``mode``) of the collections that may save in
        ``mode``; cached, since it is consulted at every step (looked up again whenever a
        configuration object is replaced, see config_generation)."""
        key = (mode, config_generation(), len(self._collections_to_save))
        if self._rules_key != key:
            self._rules_cache = {}
            self._rules_key = key
        rules = self._rules_cache.get(mode)
        if rules is None:
            rules = [
                (c, c.effective_save_config().get_save_config(mode)) for c in self._collections_to_save
                if not (mode in (ModeKeys.EVAL, ModeKeys.PREDICT) and c.name in TRAIN_ONLY_COLLECTIONS)
            ]
            self._rules_cache[mode] = rules
        return rules

    def _check_stop_signal(self) -> None:
        """Look (at most every stop_check_interval seconds) for a rule's stop signal."""
        now = time.monotonic()
        if now < self._next_stop_check:
            return
        self._next_stop_check = now + self.stop_check_interval
        try:
            if not self.storage.exists(paths.STOP_SIGNAL_FILE):
                return
            signal = json.loads(self.storage.read(paths.STOP_SIGNAL_FILE) or b"{}")
        except (OSError, ValueError) as exc:
            logger.debug("could not read the stop signal: %s", exc)
            return
        self.stop_requested = signal if isinstance(signal, dict) else {}
        logger.warning("rule %s asked training to stop (step %s): ending at this step boundary",
                       self.stop_requested.get("rule", "?"), self.stop_requested.get("step"))

    def _stop_training_error(self) -> StopTrainingRequested:
        signal = self.stop_requested or {}
        return StopTrainingRequested(str(signal.get("rule", "a rule")), signal.get("step"),
                                     str(signal.get("message", "")))

    def _end_step(self) -> None:
        """Write what the current step collected (scalars, NaN-triggered tensors) and close it."""
        if self.step < 0 or self.writer is None:
            return
        if self._pending_scalars:
            if not self.writer.step_open:
                self.writer.open_step(self.step, self.mode, self.mode_steps[self.mode])
            for name, value, ts in self._pending_scalars:
                self._write_record(name, value, ts)
                if self.tensorboard is not None:
                    self.tensorboard.add_scalar(self._step_mode, self.step, name, float(value.reshape(-1)[0]), ts)
            self._pending_scalars.clear()
        if self._nan_buffer:
            if self._nan_seen:
                logger.info("NaN seen at step %d: saving %d watched tensors", self.step, len(self._nan_buffer))
                for name, value, colls in self._nan_buffer:
                    self._write_tensor(name, value, value, colls, on_host=True)
            self._nan_buffer.clear()
        wrote = self.writer.close_step()
        if wrote and not self._collections_exported:
            self._export_collections()
            self._collections_exported = True
        self.step_active = False

    def _open_writer(self) -> None:
        self.worker, self.num_workers = self._worker_identity()
        chief = self.worker == self._chief_worker()
        if self.dry_run or (not self.save_all_workers and not chief):
            self.writer = None
            return
        self.collection_manager.num_workers = self.num_workers if self.save_all_workers else 1
        self.writer = TrialWriter(self.storage, self.worker)
        if self.tensorboard_dir:
            self.tensorboard = TensorBoardWriter(self.tensorboard_dir, None if chief else self.worker)
        self._export_collections()

    def _export_collections(self) -> None:
        if self.writer is not None:
            self.writer.write_collections(self.collection_manager.to_json())

    # Adapters override these three.
    def _worker_identity(self) -> tuple[str, int]:
        """(worker name, number of workers) of this process."""
        return paths.DEFAULT_WORKER_NAME, 1

    def _chief_worker(self) -> str:
        return paths.DEFAULT_WORKER_NAME

    def _to_numpy(self, value: Any) -> np.ndarray:
        """A host numpy copy of a framework tensor (adapters override)."""
        return as_numpy(value)

    def _reduce(self, value: Any, items: list[tuple[str, bool]]) -> list[np.ndarray | None]:
        """Compute reductions ``items`` of ``value``; adapters do it on the device."""
        from mltrace.reductions import compute

        array = self._to_numpy(value)
        return [compute(name, array, abs_) for name, abs_ in items]

    # -- saving ---------------------------------------------------------------------------------
    def _save_for_tensor(self, name: str, value: Any) -> None:
        """Save ``value`` under ``name`` if a collection it belongs to is due this step."""
        colls = self._collections_of(name)
        if not colls:
            return
        due = [c for c in colls if c in self._due]
        if due:
            self._write_tensor(name, value, None, due)
        elif self._nan_watch:
            self._watch_nan(name, value, colls)

    def _watch_nan(self, name: str, value: Any, colls: tuple[Collection, ...]) -> None:
        mode = self.mode
        watching = [c for c in colls if c.effective_save_config().get_save_config(mode).when_nan]
        if name in self._nan_watch:
            array = self._to_numpy(value)
            if array.dtype.kind in "fc" and np.isnan(array).any():
                self._nan_seen = True
            if watching:
                self._nan_buffer.append((name, array, tuple(watching)))
        elif watching:
            self._nan_buffer.append((name, self._to_numpy(value), tuple(watching)))

    def _write_tensor(self, name: str, value: Any, array: np.ndarray | None,
                      colls: Iterable[Collection], on_host: bool = False) -> None:
        """Write the shape, reductions and raw value that ``colls`` ask for."""
        if self.writer is None or name in self._written_this_step:
            return
        self._written_this_step.add(name)
        try:
            self._write_tensor_parts(name, value, array, colls, on_host)
        except MltraceTypeError as exc:
            # One odd tensor (say, a quantized dtype) must not stop the others from being saved.
            if self.strict:
                raise
            if name not in self._unsupported:
                self._unsupported.add(name)
                logger.warning("not saving tensor %r: %s", name, exc)

    def _write_tensor_parts(self, name: str, value: Any, array: np.ndarray | None,
                            colls: Iterable[Collection], on_host: bool) -> None:
        assert self.writer is not None
        save_raw, save_shape, items = _what_to_save(colls)
        if not self.writer.step_open:
            self.writer.open_step(self.step, self.mode, self.mode_steps[self.mode])
        if save_raw or save_shape:
            if array is None:
                array = self._to_numpy(value)
            if save_shape:
                self.writer.add_shape(name, array.shape)
        if items:
            results = self._reduce(array if on_host else value, items)
            for (red, abs_), result in zip(items, results):
                if result is not None:
                    self._write_record(reduction_tensor_name(name, red, abs_), result)
        if save_raw and array is not None and array.size:
            self._write_record(name, array)
            if self.sinks and any(c.name in METRIC_COLLECTIONS for c in colls):
                self._log_to_sinks(name, float(np.mean(array)), self.mode_steps[self.mode])
        if self.tensorboard is not None:
            self._export_summaries(name, value, array, colls, on_host)
        if array is not None and name in self._nan_watch and array.dtype.kind in "fc" and np.isnan(array).any():
            self._nan_seen = True

    def _export_summaries(self, name: str, value: Any, array: np.ndarray | None,
                          colls: Iterable[Collection], on_host: bool) -> None:
        """TensorBoard scalars (tensors of scalar collections that squeeze to 0-d) and histograms
        (the first due collection with save_histogram), as smdebug exported them."""
        assert self.tensorboard is not None
        colls = list(colls)
        scalar = any(c.name in SCALAR_COLLECTIONS for c in colls)
        histo = next((c for c in colls if c.save_histogram and c.name not in NON_REDUCTION_COLLECTIONS), None)
        if not scalar and histo is None:
            return
        if array is None:
            array = value if on_host else self._to_numpy(value)
        array = getattr(array, "to_float32", lambda: array)()  # bfloat16 bits -> their float32 values
        if scalar and array.size == 1 and array.dtype.kind in "biuf":
            self.tensorboard.add_scalar(self._step_mode, self.step, name, float(array.reshape(-1)[0]))
        if histo is not None:
            self.tensorboard.add_histogram(self._step_mode, self.step, f"{histo.name}/{clean_tag(name)}", array)

    def _write_record(self, name: str, array: np.ndarray, wall_time: float | None = None) -> None:
        assert self.writer is not None
        self.writer.add_tensor(name, array, self.mode, self.mode_steps[self.mode], wall_time)

    @guarded()
    def save_scalar(self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar as ``scalar/<name>`` in the current step (written at its end).

        Scalars also go to the tracking sinks (MLflow), whatever ``sm_metric`` says (smdebug
        sent ``sm_metric=True`` scalars to SageMaker Metrics).
        """
        check_tensor_name(name, "save_scalar name")
        array = self._to_numpy(value)
        if array.size != 1:
            raise MltraceValueError(f"save_scalar({name!r}): value has {array.size} elements; pass one number")
        self._pending_scalars.append((SCALAR_PREFIX + name, array, timestamp))
        if self.sinks:
            step = max(self.mode_steps[self.mode], 0)
            self._log_to_sinks(name, float(array.reshape(-1)[0]), step)

    def _log_to_sinks(self, name: str, value: float, mode_step: int) -> None:
        """Hand a scalar to every sink. A sink that raises is the sink's problem, not the
        trial's: its first error is logged, the rest are counted (summed up at close), it is
        called again next time, and tensors are saved as usual; strict hooks re-raise."""
        for sink in self.sinks:
            try:
                sink.log_scalar(name, value, self.mode, mode_step)
            except Exception as exc:
                if self.strict:
                    raise
                count = self._sink_errors[id(sink)] = self._sink_errors.get(id(sink), 0) + 1
                if count == 1:
                    logger.error("sink %r failed to log %r (the trial is still saved; further "
                                 "errors of this sink are counted): %s: %s. Pass strict=True to "
                                 "raise instead.", sink, name, type(exc).__name__, exc)

    def _raise_write_failure(self, *writers: Any) -> None:
        """Raise the first file that ``writers`` (a TrialWriter, a TensorBoardWriter) could not
        write since the last look, for strict hooks; each failure is raised once."""
        for writer in writers:
            failure = writer.failures.take() if writer is not None else None
            if failure is not None:
                raise failure

    @guarded()
    def save_tensor(self, tensor_name: str, tensor_value: Any, collections_to_write: str | Iterable[str] = "default") -> None:
        """Save a tensor of your own into the named collections (created if needed) this step,
        if one of them is due."""
        check_tensor_name(tensor_name, "save_tensor name")
        names = name_list("collections_to_write", collections_to_write, "collection name", "weights")
        added = False
        for cname in names:
            coll = self.get_collection(cname)
            coll.add_tensor_name(tensor_name)
            if self._prepared and coll not in self._collections_to_save:
                self._collections_to_save.append(coll)
                added = True
            elif not self._prepared and cname not in self.include_collections:
                self.include_collections.append(cname)
        if added:
            self._tensor_collections.pop(tensor_name, None)
            self._begin_due_refresh()
        else:
            self._tensor_collections.pop(tensor_name, None)
        if self._prepared and self.step >= 0:
            self._save_for_tensor(tensor_name, tensor_value)

    def _begin_due_refresh(self) -> None:
        """Recompute which collections are due this step after collections were added mid-step."""
        mode_step = self.mode_steps[self.mode]
        self._due = frozenset(c for c, rule in self._save_rules(self.mode) if rule.should_save_step(mode_step))
        self.step_active = bool(self._due) or bool(self._nan_watch)

    # -- lifecycle ------------------------------------------------------------------------------
    def _disable(self, reason: str) -> None:
        if not self._disabled:
            logger.error(
                "mltrace hit an internal error and stops saving for the rest of this run (training "
                "goes on; data already written stays readable): %s. Pass strict=True to raise instead.",
                reason,
            )
        self._disabled = True
        self.step_active = False
        try:
            self._finish(write_end_marker=False)
        except Exception:  # pragma: no cover - best effort
            logger.debug("closing after an internal error failed", exc_info=True)

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
        writers = (self.writer, self.tensorboard)
        try:
            if not self._disabled:
                self._finish(write_end_marker=True)
        finally:
            self._closed = True
        if self.strict:
            self._raise_write_failure(*writers)

    def _finish(self, write_end_marker: bool) -> None:
        try:
            # No writer: never started (leave no files), a dry run, or another worker's trial.
            if self.writer is not None:
                self._end_step()
                self._export_collections()
                if self.tensorboard is not None:
                    self.tensorboard.close()
                    self.tensorboard = None
                if write_end_marker:
                    self.writer.write_end_marker()
                self.writer.close()
                self.writer = None
        finally:
            # Sinks close last, also when nothing was written: they upload the trial's files
            # (MLflow artifacts), so those must be on storage first; and they end their runs.
            sink_error = self._close_sinks()
        if sink_error is not None and self.strict:
            raise sink_error

    def _close_sinks(self) -> Exception | None:
        """Close every sink, each even if another fails; return the first error (logged)."""
        first: Exception | None = None
        for sink in self.sinks:
            errors = self._sink_errors.get(id(sink), 0)
            if errors > 1:
                logger.error("sink %r failed %d times during the run (the first is logged above)",
                             sink, errors)
            try:
                sink.close()
            except Exception as exc:
                logger.error("sink %s failed at close: %s", sink, exc)
                first = first or exc
        return first

    def __getstate__(self) -> dict[str, Any]:
        # As smdebug: a pickled hook (DataLoader workers, multiprocessing) carries nothing.
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._disabled = True
        self._closed = True
        self.step_active = False


def _what_to_save(colls: Iterable[Collection]) -> tuple[bool, bool, list[tuple[str, bool]]]:
    """(save raw tensor, save shape, reductions) that a tensor's due collections ask for."""
    save_raw = save_shape = False
    items: list[tuple[str, bool]] = []
    for coll in colls:
        config = coll.effective_reduction_config()
        save_raw |= config.save_raw_tensor
        save_shape |= config.save_shape
        if coll.name not in SCALAR_COLLECTIONS:
            items.extend(i for i in config.items() if i not in items)
    return save_raw, save_shape, items


def _load_sink(kind: str, hook: BaseHook, options: Any) -> Any:
    """Load a tracking sink lazily (core never imports mlflow). A sink has
    ``log_scalar(name, value, mode, mode_step)`` and ``close()``."""
    if kind != "mlflow":
        raise MltraceValueError(f"unknown sink {kind!r}")
    try:
        module = importlib.import_module("mlflow_plugin.sink")
    except ImportError as exc:
        raise MltraceValueError(
            f"mlflow=... needs MLflow: pip install 'mltrace[mlflow]' ({exc})"
        ) from None
    return module.create_sink(hook, {} if options is True else dict(options))


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


def _check_local_out_dir(out_dir: str, marker_path: str | None) -> None:
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


def as_numpy(value: Any) -> np.ndarray:
    """smdebug's conversion of host values: arrays as they are, Python and numpy scalars as
    shape [1], lists and tuples through np.asarray.

    Raises:
        mltrace.exceptions.MltraceTypeError: anything else.
    """
    from mltrace.exceptions import MltraceTypeError

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
