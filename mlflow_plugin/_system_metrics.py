"""MLflow's own system metrics for a hook's run: ``mlflow={"system_metrics": True}``.

mltrace writes no profiler: MLflow samples CPU, memory, disk and network (psutil), and NVIDIA or
AMD GPUs (``nvidia-ml-py`` / ROCm's ``pyrsmi`` when installed), and logs them as ``system/...``
metrics of the run. This module only decides who starts that sampler for the run the sink logs
into:

- a run the sink starts itself, or one it joins (the active run of a ``with mlflow.start_run()``,
  the run Transformers' MLflowCallback or Lightning's MLFlowLogger opened, ``run_id=``): the sink
  starts MLflow's ``SystemMetricsMonitor`` for that run and finishes it at close (or when a
  trainer callback says training ended), so the samples cover training;
- except when MLflow's own switch is on (``mlflow.enable_system_metrics_logging()`` or
  ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true``) and the run is the active one: MLflow already
  samples it (``start_run`` started a monitor), a second monitor would log every point twice.

Sampling interval and aggregation are MLflow's settings: ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``
(seconds, default 10; also ``mlflow.set_system_metrics_sampling_interval``),
``MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING`` and ``MLFLOW_SYSTEM_METRICS_NODE_ID``.
"""

from __future__ import annotations

import logging
from typing import Any

from mltrace.config import parse_flag

logger = logging.getLogger(__name__)


def wanted(options: dict[str, Any]) -> bool:
    """True when the sink options ask for system metrics (``system_metrics``: bool or "true").

    Raises:
        MltraceValueError: a value that is not a boolean.
    """
    return parse_flag("mlflow option system_metrics", options.get("system_metrics", False))


def mlflow_samples_active_runs() -> bool:
    """True when MLflow's own switch makes ``mlflow.start_run`` sample system metrics."""
    from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING

    return bool(MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get())


class SystemMetrics:
    """MLflow's sampler of system metrics for one run, started here and finished once.

    Args:
        run_id: the run the samples go to.
        tracking_uri: its tracking store.
        resume: continue the run's ``system/`` step numbers (a run that may have some already).

    Raises:
        ImportError: psutil is missing (MLflow's CPU monitor needs it); the message names the fix.
    """

    def __init__(self, run_id: str, tracking_uri: str, resume: bool) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError as exc:
            raise ImportError(f"MLflow's system metrics need psutil ({exc}): pip install psutil") from exc
        self.run_id = run_id
        self._monitor: Any = SystemMetricsMonitor(run_id, resume_logging=resume, tracking_uri=tracking_uri)
        # MLflow internal: the monitor's count of samples it logged has no public accessor
        self._first_step = getattr(self._monitor, "_logging_step", 0)
        self._monitor.start()
        logger.info("MLflow samples system metrics for run %s every %s s", run_id,
                    self._monitor.sampling_interval)

    def stop(self) -> None:
        """Stop sampling and log what was sampled (idempotent)."""
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        monitor.finish()
        if getattr(monitor, "_logging_step", None) == self._first_step:
            # Training ended within the first sampling interval (MLflow logs a sample only once
            # an interval has passed): one sample now, so the run still says what it used.
            try:
                monitor.collect_metrics()
                monitor.publish_metrics(monitor.aggregate_metrics())
                monitor.mlflow_logger.flush()
            except Exception as exc:  # the run may be gone: the samples are a nicety
                logger.warning("could not log the last system metrics of run %s: %s", self.run_id, exc)
