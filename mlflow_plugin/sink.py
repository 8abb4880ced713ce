"""The MLflow sink of a hook: ``Hook(..., mlflow=True)`` or ``mlflow={...}``.

The sink logs a hook's scalars as metrics of one MLflow run, its configuration as params, and
its trial as artifacts, without making the training loop wait for MLflow. MlflowSink is built
from one part per concern, each in a module of its own:

    _sink_run.py             which run (given, active, or a new one), its tags and params, its end
    _sink_metrics.py         scalars queued on the training thread, sent in batches by a
                             background thread through a helper process; failures, strict hooks
    _sink_losses.py          the registered losses at every step, not only at saved steps
    _sink_names.py           metric names, mode steps, and names left to MLflow autologging
    _sink_flight_recorder.py the flight recorder's dumps as run tags
    _sink_system_metrics.py  MLflow's system metrics (``system_metrics=True``)
    _sink_artifacts.py       at close: collections, ``tensorboard/`` and summary under
                             ``mltrace/``; the run's description

At close the sink waits for every batch to be logged, logs params and artifacts, and ends the
run if it started it. Workers other than the chief get a NullSink; so does a hook whose MLflow
is unreachable (the trial is still saved), unless it is built with ``strict=True``.
"""

from __future__ import annotations

import logging
from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.writer.failure_log import FailureLog

from . import _sink_losses, _system_metrics, _tracking, links
from ._sink_artifacts import RunArtifacts
from ._sink_flight_recorder import DumpTags
from ._sink_losses import EveryStepLosses
from ._sink_metrics import MetricBatching
from ._sink_names import CLAIM_DELAY, MODE_STEP_METRIC
from ._sink_run import RunLifecycle
from ._sink_system_metrics import SinkSystemMetrics

__all__ = ["CLAIM_DELAY", "MODE_STEP_METRIC", "OPTIONS", "MlflowSink", "NullSink", "create_sink"]

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
    "loss_every_step": "log the registered losses (hook.register_loss) at every step, not only "
                       "at saved steps (default true; see _sink_losses for the cost)",
    "system_metrics": "have MLflow log system metrics (CPU, memory, disk, network, GPU) in the run "
                      "as system/... (default false; interval: MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL)",
}


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
    _sink_losses.wanted(options)
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


class NullSink:
    """The sink of workers that do not log."""

    def log_scalar(self, name: str, value: float, mode: ModeKeys, mode_step: int) -> None:
        """Ignore the scalar."""

    def flight_recorder_dumped(self, record: Any, dump: Any) -> None:
        """Nothing to tag: the chief worker's sink tags the run."""

    def close(self) -> None:
        """Nothing to close."""


class MlflowSink(RunLifecycle, MetricBatching, EveryStepLosses, DumpTags, SinkSystemMetrics,
                 RunArtifacts):
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
        self._system = None
        self.run_id, self.experiment_id, self._owned = self._open_run(mlflow)
        self.trial = _tracking.trial_location(hook.out_dir)
        try:
            self._autolog_run = self._tag_run_and_trial()
        except Exception:
            self._end_run("FAILED")  # a run we started must not stay RUNNING
            raise

        self._params = None
        self._params_logged = False
        self._described = False
        self._closed = False
        # strict=True hooks get a failed batch as an exception: from the next log_scalar, or close.
        self._strict = bool(getattr(hook, "strict", False))
        self._failures = FailureLog(logger, "training goes on", "failures")
        self._prepare_dump_tags()
        self._prepare_metrics()
        self._start_system_metrics(mlflow)
        self._start_batching()
        self._prepare_losses()  # last: a sink that failed to start watches nothing
        logger.info("mltrace logs to MLflow run %s (experiment %s, %s)%s", self.run_id,
                    self.experiment_id, self.tracking_uri,
                    f": {url}" if (url := links.run_url(self.tracking_uri, self.experiment_id,
                                                        self.run_id)) else "")

    def close(self) -> None:
        """Flush metrics, log params and artifacts, end the run if the sink started it."""
        if self._closed:
            return
        self._closed = True
        self._stop_watching_losses()
        if self._params is None:
            self._params = self._safe_hook_params()
        self._stop_batching()
        self._set_pending_tags()  # any the background thread did not get to
        self._log_params_once()
        self._report_losses()
        self._log_artifacts()
        self._stop_system_metrics_quietly()
        self._end_run()
        if self._strict:
            self._raise_failure()

    def __repr__(self) -> str:
        return f"<MlflowSink run {self.run_id} at {self.tracking_uri}>"
