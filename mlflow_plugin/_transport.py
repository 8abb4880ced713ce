"""How a sink's metric batches reach MLflow: through a helper process (default) or from the
sink's own background thread.

Both take batches of ``(key, value, timestamp_ms, step)`` tuples whose keys are already valid
MLflow names. ``send`` raises when a batch cannot be handed over; ``close`` waits until every
batch handed over was logged and returns ``(logged, failed batches, first error)``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from typing import Any

from . import _keys, _metrics_process

logger = logging.getLogger(__name__)

Batch = list[tuple[str, float, int, int]]


class ThreadTransport:
    """``log_batch`` calls from the calling (background) thread, chunked to MLflow's limit."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    def send(self, batch: Batch) -> None:
        """Log ``batch`` now (raises what MLflow raises)."""
        from mlflow.entities import Metric

        metrics = [Metric(k, v, t, s) for k, v, t, s in batch]
        for chunk in _keys.chunks(metrics, _keys.MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)

    def close(self, timeout: float | None = None) -> tuple[int, int, str | None]:
        """Nothing is pending: batches were logged in send."""
        return 0, 0, None


class ProcessTransport:
    """Batches go as JSON lines to the helper process of ``_metrics_process`` (see there why)."""

    def __init__(self, run_id: str, tracking_uri: str) -> None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", _metrics_process.__name__, run_id, tracking_uri],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            text=True, encoding="utf-8", bufsize=1 << 16,
        )
        self._ready: bool | None = None
        self._ready_lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The helper's process id."""
        return self.proc.pid

    def wait_ready(self) -> bool:
        """Block (the background thread) until the helper has imported MLflow; False if it died."""
        with self._ready_lock:  # one reader of the ready line, whichever thread asks first
            if self._ready is None:
                line = self.proc.stdout.readline()  # type: ignore[union-attr]
                self._ready = '"ready"' in line
        return self._ready

    def send(self, batch: Batch) -> None:
        """Hand ``batch`` to the helper (raises OSError if it is gone)."""
        if not self.wait_ready():
            raise OSError("the MLflow helper process did not start")
        self.proc.stdin.write(json.dumps(batch) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def close(self, timeout: float = 300.0) -> tuple[int, int, str | None]:
        """End of input: wait (at most ``timeout`` s) for the helper to log what it holds and
        exit, and return its summary. Starts no thread (it may run at interpreter exit)."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(timeout)  # the helper writes two short lines: a pipe never blocks it
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return 0, 1, f"the MLflow helper process did not finish within {timeout:.0f} s"
        out = self.proc.stdout.read()  # type: ignore[union-attr]
        summary: dict[str, Any] = {}
        for line in out.splitlines():
            if line.startswith("{") and '"logged"' in line:
                summary = json.loads(line)
        if not summary:
            return 0, 1, (f"the MLflow helper process ended (exit code {self.proc.returncode}) "
                          "without a summary")
        return int(summary.get("logged", 0)), int(summary.get("failed", 0)), summary.get("error")
