"""A diagnosis of the hook's own trial after each flight-recorder dump
(``FlightRecorderConfig(diagnose=True)``, the default).

A dump says *when* training broke; the diagnosis (mltrace.diagnosis) says where it began and
why. Made by itself after a dump, it reaches the people who would otherwise have to run
``mltrace diagnose``: mltrace.diagnosis.publish keeps it in the trial
(``mltrace_diagnosis/<worker>.json``), logs its one line and tells the diagnosis listeners (the
MLflow training run's tags).

When: once a dump triggered by training itself (not ``manual``: a dump asked for by hand is no
anomaly) is complete, its ``after_steps`` steps written and the record rewritten with them, so the
diagnosis sees the steps after the trigger too; at close when training ends first. At most one
per dump, so at most ``max_dumps``.

Where: on a daemon thread. The training thread only waits for the trial writer to write what it
was handed (``writer.flush()``, milliseconds), so the files are on storage when the thread reads
them; reading and diagnosing the trial happen beside training. ``hook.close()`` waits for a
running diagnosis at most :data:`WAIT_SECONDS`, then warns and goes on. Nothing here raises into
training: a diagnosis that fails is one warning.

The diagnosis is a layer above the capture core (see pyproject's import contracts): it is
imported when a diagnosis runs, through ``Trial.diagnose`` and mltrace.diagnosis.publish.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from mltrace.format.flight_record import Dump

logger = logging.getLogger("mltrace.flight_recorder")

#: How long ``hook.close()`` waits for the diagnoses still running.
WAIT_SECONDS = 60.0
#: The diagnosis thread's name (the log's ``threadName``).
THREAD_NAME = "mltrace-diagnosis"


class DumpDiagnosis:
    """The diagnoses of one hook's dumps: which dump waits for its after-steps, which is due, and
    the threads that run them (see the module docstring).

    The recorder tells :meth:`dumped` and :meth:`completed`; the hook's training thread calls
    :meth:`start` between steps (nothing happens unless a diagnosis is due) and :meth:`finish`
    at close.

    Args:
        out_dir: the hook's trial (a local path or a URI).
        wait_seconds: how long :meth:`finish` waits for running diagnoses.
    """

    def __init__(self, out_dir: str, wait_seconds: float = WAIT_SECONDS) -> None:
        self.out_dir = str(out_dir)
        self.wait_seconds = wait_seconds
        #: a complete dump whose diagnosis the next :meth:`start` begins (None: none is due)
        self.due: Dump | None = None
        self._waiting: Dump | None = None  # a dump whose after-steps are being written
        self._threads: list[threading.Thread] = []
        self._one_at_a_time = threading.Lock()  # reports are published in the order of the dumps

    def dumped(self, dump: Dump) -> None:
        """A dump began: diagnose it once complete, unless it was asked for by hand."""
        self._waiting = dump if dump.trigger != "manual" else None

    def completed(self) -> None:
        """The dump that began last is complete: its diagnosis is due (if it gets one)."""
        if self._waiting is not None:
            self.due, self._waiting = self._waiting, None

    def start(self, writer: Any, worker: str) -> None:
        """Begin the due diagnosis, if any, on its thread, once ``writer`` (the hook's
        TrialWriter) has written what it was handed."""
        dump, self.due = self.due, None
        if dump is None:
            return
        try:
            writer.flush()
            thread = threading.Thread(target=self._run, args=(worker, dump), name=THREAD_NAME,
                                      daemon=True)
            thread.start()
        except Exception as exc:  # noqa: BLE001 - a diagnosis never stops training
            logger.warning("flight recorder: no diagnosis of the dump at step %d: %s: %s",
                           dump.step, type(exc).__name__, exc)
            return
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def finish(self, writer: Any, worker: str) -> None:
        """At close: diagnose a dump whose after-steps training did not reach, then wait for the
        running diagnoses, at most ``wait_seconds`` in all (then warn and go on)."""
        self.completed()
        self.start(writer, worker)
        deadline = time.monotonic() + self.wait_seconds
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        if self._threads:
            logger.warning("flight recorder: the diagnosis of %s still runs after %g s; closing "
                           "without it (run mltrace diagnose %s)", self.out_dir, self.wait_seconds,
                           self.out_dir)

    def _run(self, worker: str, dump: Dump) -> None:
        with self._one_at_a_time:
            try:
                diagnose_trial(self.out_dir, worker)
            except Exception as exc:  # noqa: BLE001 - a trial that cannot be read: training goes on
                logger.warning("flight recorder: no diagnosis of the dump at step %d of %s: %s: %s",
                               dump.step, self.out_dir, type(exc).__name__, exc)


def diagnose_trial(out_dir: str, worker: str) -> None:
    """Diagnose the trial at ``out_dir`` as it is now and publish the report
    (mltrace.diagnosis.publish).

    The diagnosis reads ``worker``'s tensors, the ones this hook wrote, and is kept as that
    worker's report (``mltrace_diagnosis/<worker>.json``): each worker that dumped has its own.

    Raises:
        Exception: whatever reading the trial raises (the caller warns).
    """
    from mltrace.diagnosis.publish import publish  # a layer above: see the module docstring
    from mltrace.trials import create_trial

    trial = create_trial(out_dir, timeout=0)
    publish(trial.storage, trial.diagnose(worker=worker))


__all__ = ["DumpDiagnosis", "THREAD_NAME", "WAIT_SECONDS", "diagnose_trial"]
