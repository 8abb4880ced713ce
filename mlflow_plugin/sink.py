"""The MLflow sink of a hook: ``Hook(..., mlflow=True)`` or ``mlflow={...}``.

On the training thread the sink only appends ``(name, mode, value, time, step)`` to a deque; a
background thread takes what accumulated every ``flush_interval`` seconds (sooner when 10000 are
waiting) and hands it, as one batch, to a helper process that makes the ``log_batch`` calls (at
most 1000 metrics each): MLflow's client is pure Python and, in a thread, would hold the GIL the
training loop needs (``logging_process=False`` logs from the thread; so does the sink if the
helper cannot start or dies). At close it waits for every batch to be logged, logs the
trial's collections files, its ``tensorboard/`` folder and a summary (HTML + JSON) as artifacts
under ``mltrace/``, and ends the run if it started it.

Failures: a batch that MLflow refuses (tracking server down, a store that cannot be written) is
lost; the first failure is logged, later ones are counted and summed up at close, and training
and the trial go on. A hook built with ``strict=True`` gets the failure as an exception from its
next ``log_scalar`` call (or from ``close()``) instead.

Which run: ``run_id`` if given; else the active run (``with mlflow.start_run():`` around the
hook); else a new run, made active on the creating thread so that the user's own
``mlflow.log_*`` calls and autologging land in it too. With ``nested=True`` and an active run, a
child run. A run file in the trial records run id, experiment id and tracking URI (rules find
their parent there).

Metric names: the tensor name (``CrossEntropyLoss_output_0``) or the save_scalar name, cleaned
to MLflow's character set; in EVAL and PREDICT modes prefixed ``eval/`` and ``predict/``; step =
the global step (the x axis of the TensorBoard tab and of rule findings: every step of every
mode counts), and the mode's own step at each global step is the metric ``train/mode_step``,
``eval/mode_step`` or ``predict/mode_step`` (a chart's x axis in MLflow's UI). At close the run
gets a description (``mlflow.note.content``, see description.py). Params: the hook's configuration as ``mltrace.*``. Tags: ``mltrace.trial``,
``mltrace.framework``, ``mltrace.version``, ``mltrace.run_type``; when the hook's flight
recorder dumps, ``mltrace.first_nonfinite.*`` and ``mltrace.flight_recorder.*``
(flight_recorder.py), set from the background thread.

System metrics: ``system_metrics=True`` has MLflow sample CPU, memory, disk, network (and GPU)
utilization into the run as ``system/...`` metrics while the sink is open (see _system_metrics).

Autologging: when an MLflow autologging integration is on (or the run was created by one),
metric names that something else writes in the run (autologging, or the user) are left to it:
a new name waits CLAIM_DELAY seconds (or until close) before mltrace logs it; if by then the run
has it (or autologging's pending queue does), mltrace never logs that name. So XGBoost's
``train-rmse`` appears once even with both ``mlflow.xgboost.autolog()`` and the mltrace hook on.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from mlflow_plugin import _keys, _system_metrics, _tracking, _transport, flight_recorder, links
from mltrace import __version__
from mltrace.exceptions import MltraceRuntimeError, MltraceValueError
from mltrace.format import paths
from mltrace.format.flight_record import Dump, FlightRecord
from mltrace.modes import ModeKeys

logger = logging.getLogger(__name__)

OPTIONS = {
    "tracking_uri": "tracking URI (default: MLflow's, else sqlite:///<cwd>/mlflow.db)",
    "experiment": "experiment name for a new run (created if missing)",
    "experiment_id": "experiment id for a new run",
    "run_id": "log into this existing run (its status is left alone)",
    "run_name": "name of a new run",
    "nested": "with an active run, start a child run instead of logging into it",
    "tags": "extra tags {name: value} for the run",
    "log_params": "log the hook configuration as params (default true)",
    "artifacts": "log collections, TensorBoard folder and summary at close (default true)",
    "summary": "log the trial summary (HTML + JSON) at close (default true)",
    "flush_interval": "seconds between metric batches (default 5)",
    "metric_prefix": "prefix for every metric name, e.g. 'mltrace/' (default none)",
    "logging_process": "send metrics from a helper process, not this one (default true, or "
                       "MLTRACE_MLFLOW_PROCESS=0 for false; see _transport)",
    "system_metrics": "have MLflow log system metrics (CPU, memory, disk, network, GPU) in the run "
                      "as system/... (default false; interval: MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL)",
}
_MODE_PREFIX = {ModeKeys.EVAL: "eval/", ModeKeys.PREDICT: "predict/"}
_MAX_PENDING = 1_000_000
#: Points waiting that wake the background thread before flush_interval is up. Large batches
#: matter: MLflow's SQL store spends ~8 ms per log_batch call besides ~0.07 ms per metric.
_WAKE_AT = 10_000
#: The metric holding a mode's own step at each global step (see _flush).
MODE_STEP_METRIC = "mode_step"
#: With autologging on, seconds a new metric name waits before mltrace claims it (see _claim_keys).
CLAIM_DELAY = 10.0


def create_sink(hook: Any, options: dict[str, Any]) -> Any:
    """The sink for ``hook`` (called by mltrace.capture.hook with the ``mlflow=`` option as a dict).

    Raises:
        MltraceValueError: unknown options or invalid values.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise MltraceValueError(
            f"mlflow option(s) {unknown} unknown; valid: "
            + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items())
        )
    if options.get("tags") is not None and not isinstance(options["tags"], dict):
        raise MltraceValueError(f"mlflow option tags={options['tags']!r} must be a dict")
    _system_metrics.wanted(options)  # a value that is not a boolean fails here
    try:
        worker, _ = hook.adapter.worker_identity()
        if worker != hook.adapter.chief_worker():
            logger.info("worker %s does not log to MLflow (the chief worker does)", worker)
            return NullSink()
    except Exception:  # identity not known yet: log from this process
        pass
    try:
        return MlflowSink(hook, options)
    except MltraceValueError:
        raise
    except Exception as exc:  # MLflow unreachable or refusing: training goes on without it
        if getattr(hook, "strict", False):
            raise
        logger.error("MLflow logging is off for this hook (the trial is still saved): %s: %s "
                     "(pass strict=True to raise instead)", type(exc).__name__, exc)
        return NullSink()


def _compact(save_config: dict[str, Any]) -> dict[str, Any]:
    """A SaveConfig's JSON with one entry instead of four when every mode is configured alike."""
    values = list(save_config.values())
    return values[0] if values and all(v == values[0] for v in values) else save_config


class NullSink:
    """The sink of workers that do not log."""

    def log_scalar(self, name: str, value: float, mode: ModeKeys, mode_step: int) -> None:
        """Ignore the scalar."""

    def flight_recorder_dumped(self, record: Any, dump: Any) -> None:
        """Nothing to tag: the chief worker's sink tags the run."""

    def close(self) -> None:
        """Nothing to close."""


class MlflowSink:
    """Logs a hook's scalars, configuration and trial to one MLflow run (see the module doc)."""

    def __init__(self, hook: Any, options: dict[str, Any]) -> None:
        import mlflow
        from mlflow import MlflowClient

        self.hook = hook
        self.options = options
        self.flush_interval = float(options.get("flush_interval", 5.0))
        if self.flush_interval <= 0:
            raise MltraceValueError(
                f"mlflow option flush_interval={self.flush_interval} must be > 0")
        self.prefix = str(options.get("metric_prefix") or "")
        self.tracking_uri = _tracking.resolve_tracking_uri(options.get("tracking_uri"))
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self._fluent = self.tracking_uri == _tracking.absolute_uri(mlflow.get_tracking_uri())
        self._system: _system_metrics.SystemMetrics | None = None
        self.run_id, self.experiment_id, self._owned = self._open_run(mlflow)
        self.trial = _tracking.trial_location(hook.out_dir)
        try:
            self._autolog_run = self._tag_run_and_trial()
        except Exception:
            self._end_run("FAILED")  # a run we started must not stay RUNNING
            raise

        self._pending: collections.deque = collections.deque(maxlen=_MAX_PENDING)
        self._keys: dict[tuple[str, ModeKeys], str] = {}
        #: metric key -> the (name, mode) it is for
        self._key_owners: dict[str, tuple[str, ModeKeys]] = {}
        self._own_keys: set[str] = set()
        self._foreign_keys: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self._held: list[tuple] = []
        #: the last global step whose mode step was logged, per mode
        self._mode_step_logged: dict[ModeKeys, int] = {}
        self._params: dict[str, str] | None = None
        self._params_logged = False
        self._described = False
        self._dropped = 0
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._failed_batches = 0
        self._first_error: str | None = None
        # strict=True hooks get a failed batch as an exception: from the next log_scalar, or close.
        self._strict = bool(getattr(hook, "strict", False))
        self._unraised: str | None = None
        self.metrics_sent = 0
        #: tags the training thread handed over (flight recorder dumps), set by the thread
        self._pending_tags: dict[str, str] = {}
        self._tags_lock = threading.Lock()
        self._transport: Any = _transport.ThreadTransport(self.client, self.run_id)
        flag = os.environ.get("MLTRACE_MLFLOW_PROCESS", "1").strip().lower()
        default = flag not in ("0", "false", "no")
        if options.get("logging_process", default):
            try:
                self._transport = _transport.ProcessTransport(self.run_id, self.tracking_uri)
            except OSError as exc:
                logger.warning("no MLflow helper process (%s): metrics are logged from a thread",
                               exc)
        self._start_system_metrics(mlflow)
        self._thread = threading.Thread(target=self._run, name="mltrace-mlflow", daemon=True)
        self._thread.start()
        logger.info("mltrace logs to MLflow run %s (experiment %s, %s)%s", self.run_id,
                    self.experiment_id, self.tracking_uri,
                    f": {url}" if (url := links.run_url(self.tracking_uri, self.experiment_id,
                                                        self.run_id)) else "")

    # -- the run ----------------------------------------------------------------------------------
    def _open_run(self, mlflow: Any) -> tuple[str, str, str | None]:
        """(run id, experiment id, how we own it: "fluent", "client" or None)."""
        opts = self.options
        if opts.get("run_id"):
            run = self.client.get_run(str(opts["run_id"]))
            return run.info.run_id, run.info.experiment_id, None
        active = mlflow.active_run() if self._fluent else None
        if active is not None and not opts.get("nested"):
            if opts.get("experiment") or opts.get("experiment_id") or opts.get("run_name"):
                logger.warning("an MLflow run is active (%s): the hook logs into it; its "
                               "experiment/run_name options apply to new runs only (nested=True "
                               "starts a child)", active.info.run_id)
            return active.info.run_id, active.info.experiment_id, None
        exp = _tracking.experiment_id_for(
            self.client, opts.get("experiment"), opts.get("experiment_id"),
            fluent_store=self._fluent)
        if active is not None and not (opts.get("experiment") or opts.get("experiment_id")):
            exp = active.info.experiment_id
        tags = {str(k): _keys.tag_value(v) for k, v in (opts.get("tags") or {}).items()}
        name = opts.get("run_name")
        if self._fluent:
            # System metrics of a run we start come from our own monitor (see _system_metrics):
            # False keeps MLflow's global switch from starting a second one.
            run = mlflow.start_run(experiment_id=exp, run_name=name, nested=active is not None,
                                   tags=tags,
                                   log_system_metrics=False if _system_metrics.wanted(opts) else None)
            return run.info.run_id, run.info.experiment_id, "fluent"
        from mlflow.tracking.context.registry import resolve_tags

        run = self.client.create_run(exp, run_name=name, tags=resolve_tags(tags))
        return run.info.run_id, run.info.experiment_id, "client"

    def _tag_run_and_trial(self) -> bool:
        """Tag the run, write the run file into the trial; True if autologging made the run."""
        module = type(self.hook).__module__.split(".")
        framework = module[1] if len(module) > 1 and module[0] == "mltrace" else module[0]
        self._set_tags({
            _keys.TAG_TRIAL: self.trial,
            _keys.TAG_VERSION: __version__,
            _keys.TAG_FRAMEWORK: framework,
            _keys.TAG_RUN_TYPE: "training",
        })
        run = self.client.get_run(self.run_id)
        _tracking.write_run_file(self.hook.storage, _tracking.RunFile(
            run_id=self.run_id, experiment_id=self.experiment_id, tracking_uri=self.tracking_uri,
            artifact_uri=run.info.artifact_uri))
        return "mlflow.autologging" in run.data.tags

    def _start_system_metrics(self, mlflow: Any) -> None:
        """Have MLflow sample system metrics into the run, if asked (see _system_metrics). A
        failure (psutil missing) is logged with its fix and the sink goes on without them."""
        if not _system_metrics.wanted(self.options):
            return
        active = mlflow.active_run() if self._fluent else None
        if (self._owned != "fluent" and active is not None and active.info.run_id == self.run_id
                and _system_metrics.mlflow_samples_active_runs()):
            logger.info("MLflow's own system-metrics logging is on and samples run %s already",
                        self.run_id)
            return
        try:
            self._system = _system_metrics.SystemMetrics(
                self.run_id, self.tracking_uri, resume=self._owned is None)
        except Exception as exc:
            if self._strict:
                raise
            logger.error("no system metrics in MLflow run %s: %s", self.run_id, exc)

    def stop_system_metrics(self) -> None:
        """Stop sampling system metrics (training ended) and log what was sampled; close()
        does it too. Trainer callbacks call it at the end of training."""
        if self._system is not None:
            self._system.stop()

    def _set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(_keys.clean_key(k), _keys.tag_value(v)) for k, v in tags.items()]
        for chunk in _keys.chunks(items, _keys.MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=chunk, synchronous=True)

    # -- training thread --------------------------------------------------------------------------
    def log_scalar(self, name: str, value: float, mode: ModeKeys, mode_step: int) -> None:
        """Queue one scalar (called on the training thread: an append, nothing more).

        Raises:
            mltrace.exceptions.MltraceRuntimeError: only for strict hooks, once per failure of
                the background logging since the last raise (else failures are only logged).
        """
        if self._unraised is not None and self._strict:
            self._raise_failure()
        pending = self._pending
        if len(pending) == _MAX_PENDING:
            self._dropped += 1  # MLflow is far behind: the oldest point falls out of the deque
        step = getattr(self.hook, "step", mode_step)  # the global step (the TensorBoard tab's)
        pending.append((name, mode, value, time.time(), step if step >= 0 else mode_step,
                        mode_step))
        if self._params is None and self.hook.prepared:
            self._params = self._safe_hook_params()
        if len(pending) >= _WAKE_AT:
            self._wake.set()

    def flight_recorder_dumped(self, record: FlightRecord, dump: Dump) -> None:
        """Tag the run with the dump and the first non-finite tensor (see flight_recorder.py).

        Called by the hook on the training thread: it only hands the tags to the background
        thread (set within ``flush_interval``, at the latest at close). Never raises; a strict
        hook gets a failure to set them from its next ``log_scalar`` or ``close``.
        """
        try:
            tags = flight_recorder.dump_tags(record, dump)
        except Exception as exc:  # a record of another shape: no tags, never a failed step
            logger.warning("flight recorder dump not tagged on MLflow run %s: %s", self.run_id,
                           exc)
            return
        with self._tags_lock:
            self._pending_tags.update(tags)
        if self._closed:  # after close (a dump at interpreter exit): no thread is left to do it
            self._set_pending_tags()
        else:
            self._wake.set()

    def _set_pending_tags(self) -> None:
        with self._tags_lock:
            tags, self._pending_tags = self._pending_tags, {}
        if not tags:
            return
        try:
            self._set_tags(tags)
        except Exception as exc:
            if self._strict and self._unraised is None:
                self._unraised = f"flight recorder tags: {exc}"
            logger.error("could not tag MLflow run %s with the flight recorder dump: %s",
                         self.run_id, exc)

    def _safe_hook_params(self) -> dict[str, str]:
        try:
            return self._hook_params()
        except Exception as exc:  # a hook of another shape: no params, never a failed step
            logger.warning("the hook configuration is not logged as MLflow params: %s", exc)
            return {}

    def _hook_params(self) -> dict[str, str]:
        """The hook's configuration as params (taken once, after its collections are fixed)."""
        import json

        hook = self.hook
        hook_save = _compact(hook.save_config.to_json_dict())
        out = {
            "mltrace.include_collections": json.dumps(list(hook.include_collections)),
            "mltrace.save_config": json.dumps(hook_save, sort_keys=True),
            "mltrace.reduction_config": json.dumps(hook.reduction_config.to_json_dict(),
                                                   sort_keys=True),
            "mltrace.save_all": str(hook.save_all),
            "mltrace.include_workers": hook.include_workers,
        }
        for coll in hook.plan.saved:
            entry: dict[str, Any] = {"include_regex": list(coll.include_regex)}
            save = _compact(coll.effective_save_config().to_json_dict())
            if save != hook_save:
                entry["save_config"] = save
            if coll.reduction_config is not None and coll.reduction_config != hook.reduction_config:
                entry["reduction_config"] = coll.reduction_config.to_json_dict()
            out[f"mltrace.collection.{coll.name}"] = json.dumps(entry, sort_keys=True)
        return {_keys.clean_key(k): _keys.param_value(v) for k, v in out.items()}

    # -- background thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            stopping = self._stopping
            try:
                self._flush()
            except Exception as exc:  # never let the thread die: training goes on
                logger.warning("MLflow logging failed: %s", exc)
            if stopping:
                return

    def _flush(self) -> None:
        if self._params and not self._params_logged and self.options.get("log_params", True):
            self._params_logged = True
            self._log_params(self._params)
        if self._params is not None and not self._described:
            # Once training runs, a first description (trial, collections; rules add their
            # findings as they run): a live run's page says what it is before close rewrites it.
            self._described = True
            try:
                self._describe()
            except Exception as exc:
                logger.debug("first description of run %s: %s", self.run_id, exc)
        self._set_pending_tags()
        items, self._held = self._held, []
        pending = self._pending
        while pending:
            items.append(pending.popleft())
        if not items:
            return
        if self._autologging():
            items = self._claim_keys(items)
        batch = []
        for name, mode, value, ts, step, mode_step in items:
            key = self._key(name, mode)
            if key in self._foreign_keys:
                continue
            self._own_keys.add(key)
            batch.append((key, float(value), int(ts * 1000), int(step)))
            if mode is not ModeKeys.GLOBAL and self._mode_step_logged.get(mode) != step:
                # The mode's own step at this global step: a metric the MLflow UI can use as a
                # chart's x axis (eval/loss over eval/mode_step).
                self._mode_step_logged[mode] = step
                batch.append((self._mode_step_key(mode), float(mode_step), int(ts * 1000),
                              int(step)))
        if batch:
            self._send(batch)

    def _send(self, batch: list[tuple[str, float, int, int]]) -> None:
        try:
            self._transport.send(batch)
            self.metrics_sent += len(batch)
            return
        except Exception as exc:
            if isinstance(self._transport, _transport.ProcessTransport):
                logger.warning("the MLflow helper process (pid %d) is gone (%s): mltrace logs "
                               "metrics from a thread from now on", self._transport.pid, exc)
                self._retire_process()
                self._send(batch)
                return
            self._failed(exc)

    def _failed(self, error: Any, batches: int = 1) -> None:
        self._failed_batches += batches
        if self._unraised is None:
            self._unraised = str(error)
        if self._first_error is None:
            self._first_error = str(error)
            logger.error("could not log metrics to MLflow run %s: %s (further failures are "
                         "counted and reported at close)", self.run_id, error)

    def _raise_failure(self) -> None:
        error, self._unraised = self._unraised, None
        raise MltraceRuntimeError(
            f"could not log metrics to MLflow run {self.run_id} at {self.tracking_uri}: {error}; "
            "check the tracking store (a hook with strict=False logs this once and keeps training)")

    def _retire_process(self, timeout: float = 30.0) -> None:
        """Switch to the thread transport; account for what the helper process did."""
        old, self._transport = self._transport, _transport.ThreadTransport(self.client, self.run_id)
        logged, failed, error = old.close(timeout=timeout)
        if failed or error:
            self._failed(error or "the helper process failed", max(failed, 1))

    def _key(self, name: str, mode: ModeKeys) -> str:
        """The metric key of ``name`` in ``mode``: cleaned to MLflow's rules, and distinct per
        name, so that names that clean to the same key ('a//b' and 'a/b', two long names with
        the same first 250 characters) never share (and mix) one metric."""
        key = self._keys.get((name, mode))
        if key is None:
            prefix = self.prefix + _MODE_PREFIX.get(mode, "")
            key = _keys.clean_key(name, prefix)
            owner = self._key_owners.setdefault(key, (name, mode))
            if owner != (name, mode):
                key = _keys.unique_key(key, prefix + name)
                self._key_owners[key] = (name, mode)
            if key != prefix + name:
                logger.info("%r is logged to MLflow as the metric %r (MLflow's rules for names)",
                            name, key)
            self._keys[(name, mode)] = key
        return key

    def _mode_step_key(self, mode: ModeKeys) -> str:
        """``train/mode_step``, ``eval/mode_step``, ``predict/mode_step`` (with metric_prefix)."""
        return _keys.clean_key(f"{mode.name.lower()}/{MODE_STEP_METRIC}", self.prefix)

    def _autologging(self) -> bool:
        if self._autolog_run:
            return True
        try:
            from mlflow.utils.autologging_utils import AUTOLOGGING_INTEGRATIONS
        except ImportError:  # pragma: no cover - older MLflow
            return False
        return any(not cfg.get("disable", True) for cfg in list(AUTOLOGGING_INTEGRATIONS.values()))

    def _claim_keys(self, items: list[tuple]) -> list[tuple]:
        """With autologging on, decide who owns each new metric name. A name is claimed only
        once it has waited CLAIM_DELAY seconds (or at close), so autologging, which logs in its
        own batches, has had time to write it first; names that the run then has from another
        writer stay with that writer. Items of names still waiting are held for the next flush."""
        now = time.monotonic()
        undecided = {self._key(n, m) for n, m, *_ in items} - self._own_keys - self._foreign_keys
        for key in undecided:
            self._first_seen.setdefault(key, now)
        ready = {k for k in undecided if self._stopping or now - self._first_seen[k] >= CLAIM_DELAY}
        if ready:
            present = set(self.client.get_run(self.run_id).data.metrics)
            try:  # autologging's own queue (PyTorch SummaryWriter scalars it has not sent yet)
                from mlflow.utils.autologging_utils import metrics_queue

                # MLflow internal: no public API lists what autologging holds unsent (flushing it
                # would send it, from our thread); read-only, and any failure is ignored below.
                queued = list(metrics_queue._metrics_queue)
                present |= {m.key for rid, m in queued if rid == self.run_id}
            except Exception:  # pragma: no cover - internal of MLflow; best effort
                pass
            for key in sorted(ready & present):
                logger.info("metric %r is logged by MLflow autologging (or your code) in run %s: "
                            "mltrace does not log it a second time", key, self.run_id)
                self._foreign_keys.add(key)
            self._own_keys |= ready - present
        waiting = undecided - ready
        if not waiting:
            return items
        self._held = [i for i in items if self._key(i[0], i[1]) in waiting]
        return [i for i in items if self._key(i[0], i[1]) not in waiting]

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = []
        for key, value in params.items():
            if key in existing:
                if existing[key] != value:
                    logger.warning("run %s already has param %s=%r; mltrace's value %r is not "
                                   "logged (MLflow params cannot change)", self.run_id, key,
                                   existing[key], value)
                continue
            fresh.append(Param(key, value))
        for chunk in _keys.chunks(fresh, _keys.MAX_PARAMS_TAGS_PER_BATCH):
            try:
                self.client.log_batch(self.run_id, params=chunk, synchronous=True)
            except Exception as exc:
                logger.warning("could not log the hook configuration as params: %s", exc)

    # -- close ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush metrics, log params and artifacts, end the run if the sink started it."""
        if self._closed:
            return
        self._closed = True
        if self._params is None:
            self._params = self._safe_hook_params()
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=300)
        if self._thread.is_alive() and isinstance(self._transport, _transport.ProcessTransport):
            logger.error("the MLflow helper process (pid %d) does not respond: stopping it (the "
                         "batches it held are lost; the rest are logged from this process)",
                         self._transport.pid)
            self._transport.proc.kill()  # unblocks the background thread (end of its pipes)
            self._thread.join()
        if isinstance(self._transport, _transport.ProcessTransport):
            self._retire_process(timeout=600.0)
        self._set_pending_tags()  # any the background thread did not get to
        if self._params and not self._params_logged and self.options.get("log_params", True):
            self._params_logged = True
            self._log_params(self._params)
        if self._dropped:
            logger.warning("MLflow logging fell behind: %d metric points were dropped",
                           self._dropped)
        if self._failed_batches > 1:
            logger.error("%d metric batches could not be logged to MLflow run %s; first error: %s",
                         self._failed_batches, self.run_id, self._first_error)
        if self.options.get("artifacts", True):
            for step in (self._log_trial_files, self._log_summary, self._describe):
                try:
                    step()
                except Exception as exc:
                    logger.warning("MLflow artifacts of %s: %s failed: %s", self.trial,
                                   step.__name__, exc)
        try:
            self.stop_system_metrics()
        except Exception as exc:  # MLflow's monitor: never a reason to leave the run open
            logger.warning("stopping MLflow's system metrics of run %s failed: %s", self.run_id, exc)
        self._end_run()
        if self._unraised is not None and self._strict:
            self._raise_failure()

    def _log_trial_files(self) -> None:
        """The collections files and the TensorBoard export, under ``mltrace/``."""
        from mltrace.storage import open_storage

        storage = self.hook.storage
        tb_dir = getattr(self.hook, "tensorboard_dir", None)
        if not tb_dir:  # hooks without the attribute: the trial's own tensorboard/ folder
            local = storage.local_path(paths.TENSORBOARD_DIR)
            tb_dir = local if local and os.path.isdir(local) else None
        copies: dict[str, tuple[Any, str]] = {
            f"collections/{os.path.basename(k)}": (storage, k)
            for k in storage.list(paths.COLLECTIONS_DIR) if paths.parse_collections_key(k)}
        if tb_dir and "://" not in tb_dir:
            if os.path.isdir(tb_dir) and os.listdir(tb_dir):
                self.client.log_artifacts(self.run_id, tb_dir,
                                          f"{_keys.ARTIFACT_DIR}/{paths.TENSORBOARD_DIR}")
        elif tb_dir:  # remote (s3://...): copy through a temporary folder
            tb_storage = open_storage(tb_dir)
            copies.update({f"{paths.TENSORBOARD_DIR}/{k}": (tb_storage, k)
                           for k in tb_storage.list("")})
        if not copies:
            return
        tmp = tempfile.mkdtemp(prefix="mltrace-mlflow-")
        try:
            for rel, (where, key) in copies.items():
                target = os.path.join(tmp, *rel.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(where.read(key))
            self.client.log_artifacts(self.run_id, tmp, _keys.ARTIFACT_DIR)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _log_summary(self) -> None:
        if not self.options.get("summary", True) or self.hook.step < 0:
            return
        from mlflow_plugin import summary

        summary.log_summary(self.client, self.run_id, self.trial)

    def _describe(self) -> None:
        """The run's description: trial, steps, collections, rule findings (Markdown)."""
        from mlflow_plugin import description

        description.update_training_description(self.client, self.run_id)

    def _end_run(self, status: str = "FINISHED") -> None:
        if self._owned is None:
            return
        try:
            if self._owned == "fluent":
                import mlflow

                active = mlflow.active_run()
                if active is not None and active.info.run_id == self.run_id:
                    links.end_run(self.client, self.run_id, status,
                                  end=lambda: mlflow.end_run(status))
                    return
            links.end_run(self.client, self.run_id, status)
        except Exception as exc:
            logger.warning("could not end MLflow run %s: %s", self.run_id, exc)

    def __repr__(self) -> str:
        return f"<MlflowSink run {self.run_id} at {self.tracking_uri}>"
