"""How a hook's MLflow sink gets scalars off the training thread and into the run.

On the training thread the sink only appends ``(name, mode, value, time, step, mode_step)`` to
a deque (the value may be a loss still on its device: _sink_losses); a background thread takes
what accumulated every ``flush_interval`` seconds (sooner when _WAKE_AT, 10000, are waiting),
reads such losses, and hands it, as one batch, to a helper process that makes the
``log_batch`` calls (at most 1000 metrics each): MLflow's client is pure Python and, in a
thread, would hold the GIL the training loop needs (``logging_process=False`` logs from the
thread; so does the sink if the helper cannot start or dies; see _transport). At close it waits
for every batch to be logged.

Failures: a batch that MLflow refuses (tracking server down, a store that cannot be written) is
lost; the first failure is logged, later ones are counted and summed up at close, and training
and the trial go on. A hook built with ``strict=True`` gets the failure as an exception from its
next ``log_scalar`` call (or from ``close()``) instead.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from mltrace.exceptions import MltraceRuntimeError
from mltrace.modes import ModeKeys
from mltrace.writer.failure_log import FailureLog

from . import _transport
from ._sink_losses import as_float
from ._sink_names import MetricNames

#: The sink's logger, whichever of its parts logs.
logger = logging.getLogger("mltrace_mlflow.sink")

_MAX_PENDING = 1_000_000
#: Points waiting that wake the background thread before flush_interval is up. Large batches
#: matter: MLflow's SQL store spends ~8 ms per log_batch call besides ~0.07 ms per metric.
_WAKE_AT = 10_000


class MetricBatching(MetricNames):
    """MlflowSink's part that queues scalars, and batches and sends them from its thread."""

    hook: Any
    options: dict[str, Any]
    tracking_uri: str
    flush_interval: float
    _params: dict[str, str] | None
    _strict: bool
    #: names starting with one of these are logged at every step by _sink_losses
    loss_prefixes: tuple[str, ...]
    #: failures of the background logging (mltrace.writer.failure_log's policy)
    _failures: FailureLog
    # Steps of a flush that are other parts' (the run's params, its description, dump tags).
    _log_params_once: Callable[[], None]
    _safe_hook_params: Callable[[], dict[str, str]]
    _describe_early: Callable[[], None]
    _set_pending_tags: Callable[[], None]

    def _prepare_metrics(self) -> None:
        """The queue, the counts, and the transport: the helper process unless
        ``logging_process`` (or MLTRACE_MLFLOW_PROCESS=0) says otherwise, or it cannot start."""
        self._prepare_names()
        self._pending: collections.deque = collections.deque(maxlen=_MAX_PENDING)
        #: the last global step whose mode step was logged, per mode
        self._mode_step_logged: dict[ModeKeys, int] = {}
        self._dropped = 0
        self._wake = threading.Event()
        self._stopping = False
        self.metrics_sent = 0
        self._transport: Any = _transport.ThreadTransport(self.client, self.run_id)
        flag = os.environ.get("MLTRACE_MLFLOW_PROCESS", "1").strip().lower()
        default = flag not in ("0", "false", "no")
        if self.options.get("logging_process", default):
            try:
                self._transport = _transport.ProcessTransport(self.run_id, self.tracking_uri)
            except OSError as exc:
                logger.warning("no MLflow helper process (%s): metrics are logged from a thread",
                               exc)

    def _start_batching(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mltrace-mlflow", daemon=True)
        self._thread.start()

    # -- training thread --------------------------------------------------------------------------
    def log_scalar(self, name: str, value: float, mode: ModeKeys, mode_step: int) -> None:
        """Queue one scalar (called on the training thread: an append, nothing more).

        Raises:
            mltrace.exceptions.MltraceRuntimeError: only for strict hooks, once per failure of
                the background logging since the last raise (else failures are only logged).
        """
        if self._failures.unraised and self._strict:
            self._raise_failure()
        if self.loss_prefixes and name.startswith(self.loss_prefixes):
            return  # a watched loss: _sink_losses logs it at every step, this one included
        step = getattr(self.hook, "step", mode_step)  # the global step (the TensorBoard tab's)
        self._queue(name, mode, value, time.time(), step if step >= 0 else mode_step, mode_step)

    def _queue(self, name: str, mode: ModeKeys, value: Any, ts: float, step: int,
               mode_step: int) -> None:
        """Append one point for the background thread (``value``: a number, or a device
        tensor that the background thread reads)."""
        pending = self._pending
        if len(pending) == _MAX_PENDING:
            self._dropped += 1  # MLflow is far behind: the oldest point falls out of the deque
        pending.append((name, mode, value, ts, step, mode_step))
        if self._params is None and self.hook.prepared:
            self._params = self._safe_hook_params()
        if len(pending) >= _WAKE_AT:
            self._wake.set()

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
        self._log_params_once()
        self._describe_early()
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
            number = as_float(value)  # a loss kept on its device is read here, off the loop
            if key in self._foreign_keys or number is None:
                continue
            self._own_keys.add(key)
            batch.append((key, number, int(ts * 1000), int(step)))
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

    # -- failures ---------------------------------------------------------------------------------
    def _failed(self, error: Any, batches: int = 1) -> None:
        self._failures.record(
            f"could not log metrics to MLflow run {self.run_id}: {error}",
            MltraceRuntimeError(
                f"could not log metrics to MLflow run {self.run_id} at {self.tracking_uri}: "
                f"{error}; check the tracking store (a hook with strict=False logs this once and "
                "keeps training)"), count=batches)

    def _raise_failure(self) -> None:
        failure = self._failures.take()
        if failure is not None:
            raise failure

    def _retire_process(self, timeout: float = 30.0) -> None:
        """Switch to the thread transport; account for what the helper process did."""
        old, self._transport = self._transport, _transport.ThreadTransport(self.client, self.run_id)
        logged, failed, error = old.close(timeout=timeout)
        if failed or error:
            self._failed(error or "the helper process failed", max(failed, 1))

    # -- close ------------------------------------------------------------------------------------
    def _stop_batching(self) -> None:
        """Have the thread flush what is queued and stop; wait until the helper process logged
        every batch it was handed, then send from this process."""
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

    def _report_losses(self) -> None:
        """Log how many points were dropped and how many batches failed, if any."""
        if self._dropped:
            logger.warning("MLflow logging fell behind: %d metric points were dropped",
                           self._dropped)
        self._failures.summarize(f"{{count}} failures logging to MLflow run {self.run_id}")
