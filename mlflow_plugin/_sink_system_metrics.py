"""System metrics of a hook's MLflow run while its sink is open: ``system_metrics=True`` has
MLflow sample CPU, memory, disk, network (and GPU) utilization into the run as ``system/...``
metrics (who starts the sampler, and why: _system_metrics).
"""

from __future__ import annotations

import logging
from typing import Any

from . import _system_metrics

#: The sink's logger, whichever of its parts logs.
logger = logging.getLogger("mltrace_mlflow.sink")


class SinkSystemMetrics:
    """MlflowSink's part that starts MLflow's system-metrics sampler and stops it."""

    options: dict[str, Any]
    run_id: str
    tracking_uri: str
    _fluent: bool
    _owned: str | None
    _strict: bool
    #: the sampler this sink started, if any
    _system: _system_metrics.SystemMetrics | None

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

    def _stop_system_metrics_quietly(self) -> None:
        """stop_system_metrics at close: a failure of MLflow's monitor is logged, never raised,
        so that it cannot leave the run open."""
        try:
            self.stop_system_metrics()
        except Exception as exc:
            logger.warning("stopping MLflow's system metrics of run %s failed: %s", self.run_id, exc)
