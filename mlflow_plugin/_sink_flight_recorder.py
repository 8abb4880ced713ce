"""A hook's flight recorder dumps as tags of its MLflow run (the tags: flight_recorder.py).

The hook reports a dump on the training thread, which must not wait for MLflow: the sink only
keeps the tags, and its background thread sets them with its next flush (close sets any left,
and a dump after close, at interpreter exit, sets its own).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from mltrace.exceptions import MltraceRuntimeError
from mltrace.format.flight_record import Dump, FlightRecord
from mltrace.writer.failure_log import FailureLog

from . import flight_recorder

#: The sink's logger, whichever of its parts logs.
logger = logging.getLogger("mltrace_mlflow.sink")


class DumpTags:
    """MlflowSink's part that hands flight recorder tags to its background thread."""

    run_id: str
    _closed: bool
    _strict: bool
    #: a failure a strict hook has not raised yet
    _failures: FailureLog
    _wake: threading.Event
    #: the run's part: set tags now (raises what MLflow raises)
    _set_tags: Callable[[dict[str, Any]], None]

    def _prepare_dump_tags(self) -> None:
        #: tags the training thread handed over, set by the background thread
        self._pending_tags: dict[str, str] = {}
        self._tags_lock = threading.Lock()

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
            self._failures.record(
                f"could not tag MLflow run {self.run_id} with the flight recorder dump: {exc}",
                MltraceRuntimeError(f"could not tag MLflow run {self.run_id} with the flight "
                                    f"recorder dump: {exc}; check the tracking store"))
