"""A rule's request to stop training, read from the trial's stop-signal file (see
mltrace.rules.actions, which writes it); and, on the same looks, a request to dump the flight
recorder (mltrace.format.flight_record.REQUEST_FILE)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from mltrace.exceptions import StopTrainingRequested
from mltrace.format import paths
from mltrace.format.flight_record import DumpRequest, read_request
from mltrace.storage.base import Storage

logger = logging.getLogger("mltrace.capture.hook")


class StopSignal:
    """Looks for the stop signal at most every ``interval`` seconds (never per step: on S3 each
    look is a request). Local trials default to every second, remote ones to every 5 s."""

    def __init__(self, storage: Storage, interval: float | None = None) -> None:
        self._storage = storage
        local = storage.is_local
        self.interval = interval if interval is not None else (1.0 if local else 5.0)
        #: When (time.monotonic) poll looks next; before that it only answers from memory.
        self.next_look = 0.0
        #: The signal's content once a rule asked to stop, else None.
        self.requested: dict[str, Any] | None = None
        #: Look for dump requests too (the hook has a flight recorder); requests older than
        #: this hook are an earlier run's.
        self.watch_dump_requests = False
        self._dump_ids_seen: set[str] = set()
        self._started = time.time()
        #: A dump request not handled yet, else None.
        self.dump_request: DumpRequest | None = None

    def poll(self) -> bool:
        """Look for the signal if it is time to; True once training was asked to stop."""
        if self.requested is not None:
            return True
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + self.interval
        if self.watch_dump_requests:
            self._look_for_dump_request()
        try:  # one read, not a look and a read (a round trip each on S3)
            signal = json.loads(self._storage.read(paths.STOP_SIGNAL_FILE) or b"{}")
        except FileNotFoundError:  # no rule asked
            return False
        except Exception as exc:  # noqa: BLE001 - a store that does not answer now (S3 down:
            # MltraceRuntimeError; a damaged file: ValueError) is asked again at the next look;
            # the writer reports the outage, and saving goes on.
            logger.debug("could not read the stop signal: %s", exc)
            return False
        self.requested = signal if isinstance(signal, dict) else {}
        logger.warning("rule %s asked training to stop (step %s): ending at this step boundary",
                       self.requested.get("rule", "?"), self.requested.get("step"))
        return True

    def _look_for_dump_request(self) -> None:
        try:
            request = read_request(self._storage)
        except Exception as exc:  # noqa: BLE001 - as for the stop signal: asked again next time
            logger.debug("could not read the flight recorder request: %s", exc)
            return
        if request is None or request.id in self._dump_ids_seen:
            return
        self._dump_ids_seen.add(request.id)
        if request.time and request.time < self._started:
            return  # written for an earlier run in this out_dir
        self.dump_request = request

    def error(self) -> StopTrainingRequested:
        """The exception that ends the user's loop at a step boundary."""
        signal = self.requested or {}
        return StopTrainingRequested(str(signal.get("rule", "a rule")), signal.get("step"),
                                     str(signal.get("message", "")))
