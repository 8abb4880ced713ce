"""What a background writer (mltrace.writer, mltrace.writer.tensorboard) does with files it
could not write: log the first failure at once, count the rest and sum them up at close, keep
the first messages only (a long run on a full disk fails at every step: memory must not grow
with it), and hold the first failure not yet raised for hooks built with ``strict=True``."""

from __future__ import annotations

import logging
import threading

from mltrace.exceptions import TrialWriteError

#: Failure messages kept; the rest are only counted.
KEPT_ERRORS = 100


class FailureLog:
    """The failures of one writer.

    Args:
        logger: where the first failure and the summary go.
        going_on: how the writer goes on, said with the first failure ("the export goes on").
        further: what the later failures are called in that message ("errors").
    """

    def __init__(self, logger: logging.Logger, going_on: str, further: str = "errors") -> None:
        self.logger = logger
        self.going_on = going_on
        self.further = further
        #: the first KEPT_ERRORS messages.
        self.messages: list[str] = []
        #: how many failures there were.
        self.count = 0
        self._unraised: TrialWriteError | None = None
        self._lock = threading.Lock()  # the training thread takes what the writer's thread records

    def record(self, message: str, failure: TrialWriteError | None = None) -> None:
        """One failure: ``message`` for the log, ``failure`` for a strict hook to raise."""
        if not self.count:
            self.logger.error("%s (%s; further %s are counted and reported at close)",
                              message, self.going_on, self.further)
        self.count += 1
        if len(self.messages) < KEPT_ERRORS:
            self.messages.append(message)
        with self._lock:
            if failure is not None and self._unraised is None:
                self._unraised = failure

    def take(self) -> TrialWriteError | None:
        """The first failure since the last call, or None; later ones before the next call are
        only counted."""
        with self._lock:
            failure, self._unraised = self._unraised, None
        return failure

    def summarize(self, what: str) -> None:
        """At close, when more than one failed: "<count> <what>; first: <message>"."""
        if self.count > 1:
            self.logger.error("%d %s; first: %s", self.count, what, self.messages[0])


__all__ = ["FailureLog", "KEPT_ERRORS"]
