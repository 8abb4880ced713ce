"""mltrace's one policy for failures around training that must not stop it: files the trial
writer or the TensorBoard export could not write, sinks (MLflow) that raised, metric batches a
tracking store refused. Log the first failure at once, count the rest and sum them up at close,
keep the first messages only (a long run on a full disk fails at every step: memory must not
grow with it), and hold the first failure not yet raised for hooks built with ``strict=True``,
which raise it in the training loop. (An internal error of mltrace itself is another matter: it
disables the hook, see mltrace.capture.errors.)"""

from __future__ import annotations

import logging
import threading

from mltrace.exceptions import MltraceError

#: Failure messages kept; the rest are only counted.
KEPT_ERRORS = 100


class FailureLog:
    """The failures of one writer or sink.

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
        self._unraised: MltraceError | None = None
        self._lock = threading.Lock()  # the training thread takes what the writer's thread records

    def record(self, message: str, failure: MltraceError | None = None, count: int = 1) -> None:
        """``count`` failures (a batch of several, say) told by one ``message`` for the log, and
        ``failure`` for a strict hook to raise."""
        if not self.count:
            self.logger.error("%s (%s; further %s are counted and reported at close)",
                              message, self.going_on, self.further)
        self.count += count
        if len(self.messages) < KEPT_ERRORS:
            self.messages.append(message)
        with self._lock:
            if failure is not None and self._unraised is None:
                self._unraised = failure

    @property
    def unraised(self) -> bool:
        """True while a failure waits for :meth:`take` (read without the lock: a training
        thread's check per call)."""
        return self._unraised is not None

    def take(self) -> MltraceError | None:
        """The first failure since the last call, or None; later ones before the next call are
        only counted."""
        with self._lock:
            failure, self._unraised = self._unraised, None
        return failure

    def summarize(self, what: str) -> None:
        """At close, when more than one failed: ``what`` with ``{count}`` filled in, and that the
        first is logged above ("{count} files of /tmp/run could not be written")."""
        if self.count > 1:
            self.logger.error("%s (the first is logged above)", what.replace("{count}", str(self.count)))


__all__ = ["FailureLog", "KEPT_ERRORS"]
