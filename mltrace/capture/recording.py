"""The flight recorder as one hook uses it: built from the hook's options, fed the dump requests
its stop signal found, checked against a model's size, telling the hook's sinks of each dump, and
diagnosing the trial once a dump is complete (mltrace.capture.flight_recorder_diagnosis).

The recorder itself (mltrace.capture.flight_recorder) knows nothing of hooks; this part joins it
to the hook's other parts so that the hook's own methods stay one line each.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mltrace.capture.adapter import Adapter
from mltrace.capture.clock import StepClock
from mltrace.capture.flight_recorder import FlightRecorder
from mltrace.capture.flight_recorder_diagnosis import DumpDiagnosis
from mltrace.capture.options import HookOptions
from mltrace.capture.outputs import Outputs
from mltrace.capture.plan import SavePlan
from mltrace.capture.recorder_config import check_collections
from mltrace.capture.recording_adapter import RecordingAdapter
from mltrace.capture.stop import StopSignal
from mltrace.exceptions import MltraceValueError
from mltrace.format.flight_record import Dump, FlightRecord
from mltrace.modes import ModeKeys
from mltrace.writer import TrialWriter

logger = logging.getLogger("mltrace.capture.hook")


@dataclass(eq=False)  # identity: the exception hook keeps recordings in a WeakSet
class Recording:
    """One hook's flight recorder and the hook parts it works with.

    Attributes:
        recorder: the ring and its triggers.
        plan: the hook's save plan (its collections decide what a budget check counts).
        stop: the hook's stop signal (it finds dump requests from rules and ``mltrace dump``).
        sinks: the hook's tracking sinks, read at each dump (sinks may be added later).
        strict: raise a sink's failure instead of logging it.
        writing: whether the hook still writes (an exception after close dumps nothing).
        diagnosis: the diagnoses of the dumps (None: ``FlightRecorderConfig(diagnose=False)``).
    """

    recorder: FlightRecorder
    plan: SavePlan
    stop: StopSignal
    sinks: Callable[[], list[Any]]
    strict: bool
    writing: Callable[[], bool]
    diagnosis: DumpDiagnosis | None = None

    def __post_init__(self) -> None:
        self.recorder.on_dump = self._dumped
        self.recorder.on_dump_complete = self._completed
        self.recorder.collections_of = self.plan.collections_of
        self.stop.watch_dump_requests = True
        if self.recorder.config.on_exception:
            watch_exceptions(self)

    @classmethod
    def from_options(cls, options: HookOptions, adapter: Adapter, plan: SavePlan, stop: StopSignal,
                     sinks: Callable[[], list[Any]], writing: Callable[[], bool]) -> Recording | None:
        """The recording the options ask for; None without a ``flight_recorder`` or in a dry run.

        Raises:
            mltrace.exceptions.MltraceValueError: the config names a collection the hook lacks.
        """
        config = options.flight_recorder
        if config is None or options.dry_run:
            return None
        assert not isinstance(config, (dict, bool))  # HookOptions parsed it
        if not isinstance(adapter, RecordingAdapter):
            raise MltraceValueError(
                f"flight_recorder={config!r}: this hook's framework adapter "
                f"({type(adapter).__name__}) cannot record; build the hook without flight_recorder")
        if config.collections is not None:
            check_collections(config.collections, plan.manager.get_collections())
        diagnosis = DumpDiagnosis(options.out_dir) if config.diagnose else None
        return cls(FlightRecorder(config, adapter), plan, stop, sinks, options.strict, writing,
                   diagnosis)

    def prepare(self) -> None:
        """The saved collections are fixed: resolve the recorded ones, which the plan then
        watches on every step."""
        self.plan.watch(self.recorder.resolve(self.plan.saved, self.plan.manager.get_collections()))

    def opened(self, worker: str) -> None:
        """The hook writes as ``worker`` (known once the outputs open)."""
        self.recorder.worker = self.recorder.record.worker = worker

    @property
    def active(self) -> bool:
        """True while the recorder records (it stops for good past its budget or max_dumps)."""
        return self.recorder.enabled

    def begin_step(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        """Start recording a step; a dump request found since the last one triggers first."""
        request, self.stop.dump_request = self.stop.dump_request, None
        if request is not None:
            asked = f"rule {request.rule}" if request.rule else "mltrace dump"
            self.recorder.trigger("rule" if request.rule else "manual",
                                  f"{asked} asked for a dump" + (f": {request.reason}" if request.reason else ""))
        self.recorder.begin_step(step, mode, mode_step, self.plan.members_version)

    def end_step(self, outputs: Outputs, writer: TrialWriter) -> None:
        """Close the step: the hook's own reductions are written first (the recorder's records
        skip them); a step the hook writes itself takes the recorder's records now (a dump must
        never write that step again: it would replace its file and lose what it saved); then a
        dump that a trigger of this step asked for. A step that only recorded has nothing of the
        hook's own (one check, instead of the calls that would each find nothing)."""
        pending = outputs.pending
        if pending:
            outputs.write_pending()
        self.recorder.end_step(outputs.write_records, saved=pending and writer.step_open)
        if pending or writer.step_open:  # or the recorder wrote the step (one after a trigger)
            outputs.end_step()
        self.recorder.dump_pending(writer)
        if self.diagnosis is not None and self.diagnosis.due is not None:
            self.diagnosis.start(writer, self.recorder.worker)

    def end_quiet_step(self, outputs: Outputs, writer: TrialWriter, ended: bool) -> bool:
        """Close a step that only recorded (the hook's boundary skips its own end there: nothing
        of its own was due): what the adapter reads at a step's end, then :meth:`end_step`;
        nothing if the hook's own end ran already (``ended``: XGBoost's rounds and Keras'
        batches end themselves). False once the recorder stopped for good (max_dumps, its
        budget)."""
        if not ended:
            self.recorder.adapter.on_step_end()
            self.end_step(outputs, writer)
        return self.recorder.enabled

    def begin_quiet_step(self, clock: StepClock) -> None:
        """Begin a step that only records, the clock moved already (see
        mltrace.capture.quiet). The hook marks the step active again first: an adapter that
        ends its steps itself (XGBoost's rounds, Keras' batches call ``hook.end_step``) has
        made it inactive, and its callbacks would skip the step."""
        self.begin_step(clock.step, clock.mode, clock.mode_step)
        self.recorder.adapter.on_step_begin()

    def finish(self, writer: TrialWriter) -> None:
        """At close: a dump asked for after the last step, then the record file; then the
        diagnosis of a dump that training ended before completing, and the wait for those
        still running (bounded: see mltrace.capture.flight_recorder_diagnosis)."""
        self.recorder.dump_pending(writer)
        self.recorder.write_record(writer)
        if self.diagnosis is not None:
            self.diagnosis.finish(writer, self.recorder.worker)

    def dump(self, reason: str, between_steps: bool, writer: TrialWriter | None) -> None:
        """A dump asked for by hand: written now when no step is open, else at the step's end."""
        if self.recorder.trigger("manual", str(reason)) and between_steps:
            self.recorder.dump_pending(writer)

    def on_exception(self, reason: str) -> None:
        """An exception escaped the training script: dump at the current step's end, which
        closing the hook at exit writes."""
        if self.writing():
            self.recorder.trigger("exception", reason)

    def check_budget(self, tensors: Iterable[tuple[str, int]], adapter: Adapter) -> None:
        """Raise if the budget cannot hold one step of ``tensors`` ((name, bytes) known before
        training) that belong to a recorded collection.

        Raises:
            mltrace.exceptions.MltraceValueError: the budget is too small for one step.
        """
        names = self.recorder.config.collections or self.plan.include_collections
        known = self.plan.manager.get_collections()
        colls = [known[n] for n in names if n in known]
        self.recorder.check_budget(tensors, lambda name: any(adapter.is_member(c, name) for c in colls))

    def _dumped(self, record: FlightRecord, dump: Dump) -> None:
        """A dump began: its diagnosis waits for it to complete; the sinks hear of it now."""
        if self.diagnosis is not None:
            self.diagnosis.dumped(dump)
        self._tell_sinks(record, dump)

    def _completed(self, record: FlightRecord, dump: Dump) -> None:
        """The dump's after-steps are written: diagnose it at the end of this step."""
        if self.diagnosis is not None:
            self.diagnosis.completed()

    def _tell_sinks(self, record: FlightRecord, dump: Dump) -> None:
        """Sinks that show dumps (MLflow's tags) hear of each; a sink's failure is logged."""
        for sink in self.sinks():
            told = getattr(sink, "flight_recorder_dumped", None)
            if told is None:
                continue
            try:
                told(record, dump)
            except Exception as exc:
                if self.strict:
                    raise
                logger.error("sink %r could not record the flight recorder's dump: %s", sink, exc)


# -- exceptions that escape the script ----------------------------------------------------------
_recorders: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = False


def watch_exceptions(recording: Any) -> None:
    """Have an exception that escapes the script trigger a dump of ``recording`` (anything with
    ``on_exception(reason)``; sys.excepthook, and threading.excepthook for a training thread),
    which the hook writes when the interpreter's exit closes it."""
    global _installed
    _recorders.add(recording)
    if _installed:
        return
    _installed = True
    previous, previous_thread = sys.excepthook, threading.excepthook

    def on_exception(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        _dump_all(exc_type, exc)
        previous(exc_type, exc, tb)

    def on_thread_exception(args: Any) -> None:
        if args.exc_type is not SystemExit:
            _dump_all(args.exc_type, args.exc_value)
        previous_thread(args)

    sys.excepthook = on_exception
    threading.excepthook = on_thread_exception


def _dump_all(exc_type: type[BaseException], exc: BaseException | None) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        reason = "KeyboardInterrupt"
    else:
        reason = f"{exc_type.__name__}: {exc}"
    for recording in list(_recorders):
        try:
            recording.on_exception(reason)
        except Exception:  # noqa: BLE001 - the user's exception is what must be reported
            logger.debug("flight recorder dump on exception failed", exc_info=True)


__all__ = ["Recording", "watch_exceptions"]
