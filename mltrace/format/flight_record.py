"""What a hook's flight recorder writes into a trial besides the steps it dumps.

The dumped steps themselves are ordinary steps (events and index files): smdebug's reader, rules,
the TensorBoard tab and MLflow read them like any other. This file says which steps came from the
recorder, what triggered each dump and which tensor was the first to hold a NaN or an infinity::

    mltrace_flight_recorder/<worker>.json     one per worker, rewritten at each dump
    mltrace_flight_recorder_request.json      a rule's (or the CLI's) request to dump now

Both live beside ``mltrace_rules/``; smdebug's reader never looks at them.
A request is written by ``write_request`` only and read by ``read_request``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from mltrace.format import paths

logger = logging.getLogger(__name__)

#: Where each worker's record of dumps lives (``<dir>/<worker>.json``).
RECORD_DIR = "mltrace_flight_recorder"
#: Written by the DumpFlightRecorder rule action (or by hand); running hooks look for it as they
#: look for the stop signal, and dump once per request.
REQUEST_FILE = "mltrace_flight_recorder_request.json"
#: What can start a dump.
TRIGGERS = ("nonfinite", "loss_spike", "rule", "exception", "manual")


@dataclass(frozen=True)
class FirstNonFinite:
    """The first tensor, in execution order within its step, that held a NaN or an infinity.

    ``position`` counts the recorded tensors of that step in the order the hook saw them (module
    outputs in call order, then gradients in the order autograd produced them); ``phase`` is
    ``forward`` for module inputs and outputs, ``backward`` for gradients, ``other`` otherwise.
    """

    tensor: str
    step: int
    mode: str
    mode_step: int
    worker: str
    phase: str
    position: int
    #: every recorded tensor of that step that was not finite, in execution order (at most 20)
    nonfinite_tensors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Dump:
    """One dump: why, at which step, and which steps it wrote (the steps before the trigger and
    those recorded after it at full resolution)."""

    trigger: str
    reason: str
    step: int
    mode: str
    mode_step: int
    time: float
    #: global steps written from the buffer (before the trigger) and kept after it
    steps_before: list[int] = field(default_factory=list)
    steps_after: list[int] = field(default_factory=list)
    first_nonfinite: FirstNonFinite | None = None


@dataclass
class FlightRecord:
    """One worker's dumps, oldest first, and the first non-finite tensor it saw (if any)."""

    worker: str
    dumps: list[Dump] = field(default_factory=list)
    first_nonfinite: FirstNonFinite | None = None

    @property
    def recorded_steps(self) -> list[int]:
        """Every step the recorder wrote, sorted."""
        return sorted({s for d in self.dumps for s in (*d.steps_before, *d.steps_after)})

    def to_json(self) -> bytes:
        """The file's content."""
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> FlightRecord:
        """Parse a record file.

        Raises:
            ValueError: not a record (invalid JSON or missing fields).
        """
        doc = json.loads(data)
        if not isinstance(doc, dict) or not isinstance(doc.get("worker"), str):
            raise ValueError("not a flight recorder record (no worker)")
        try:
            dumps = [Dump(**{**d, "first_nonfinite": _first(d.get("first_nonfinite"))})
                     for d in doc.get("dumps", [])]
            return FlightRecord(doc["worker"], dumps, _first(doc.get("first_nonfinite")))
        except TypeError as exc:
            raise ValueError(f"not a flight recorder record: {exc}") from None


def _first(doc: Any) -> FirstNonFinite | None:
    return FirstNonFinite(**doc) if isinstance(doc, dict) else None


def record_key(worker: str) -> str:
    """The key of ``worker``'s record file."""
    return f"{RECORD_DIR}/{paths.check_worker_name(worker)}.json"


def read_records(storage: Any) -> list[FlightRecord]:
    """Every worker's record in a trial, by worker name (damaged files are skipped with a
    warning naming them; a trial without a recorder has none)."""
    out = []
    for key in sorted(storage.list(RECORD_DIR)):
        if not key.endswith(".json"):
            continue
        try:
            out.append(FlightRecord.from_json(storage.read(key)))
        except (ValueError, TypeError) as exc:
            logger.warning("skipping damaged flight recorder record %s/%s: %s",
                           getattr(storage, "uri", ""), key, exc)
    return out


def first_nonfinite(storage: Any) -> FirstNonFinite | None:
    """The earliest first non-finite tensor over the trial's workers (lowest step, then worker)."""
    return earliest_first_nonfinite(read_records(storage))


def earliest_first_nonfinite(records: list[FlightRecord]) -> FirstNonFinite | None:
    """The earliest first non-finite tensor of ``records`` (lowest step, then worker): for
    callers that read the records anyway (one read of the files, not two)."""
    found = [r.first_nonfinite for r in records if r.first_nonfinite is not None]
    return min(found, key=lambda f: (f.step, f.worker)) if found else None


@dataclass(frozen=True)
class DumpRequest:
    """A request to the hooks writing a trial to dump their flight recorders now.

    Written by the ``dumpflightrecorder`` rule action (``rule`` and ``step`` set) or by a person
    (``mltrace dump``); a hook dumps once per ``id``, so a second request is a new file content
    with a new id. ``reason`` is the rule's message or the person's text.
    """

    id: str
    reason: str
    rule: str | None = None
    step: int | None = None
    time: float = 0.0

    def to_json(self) -> bytes:
        """The file's content; ``message`` repeats ``reason`` so that the request reads like the
        stop signal a rule writes (``rule``, ``step``, ``message``, ``time``)."""
        return json.dumps({**asdict(self), "message": self.reason}, sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> DumpRequest:
        """Parse a request file.

        Raises:
            ValueError: not a request (invalid JSON, no id).
        """
        doc = json.loads(data)
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not doc["id"]:
            raise ValueError("not a flight recorder dump request (no id)")
        step = doc.get("step")
        rule = doc.get("rule")
        when = doc.get("time")
        return DumpRequest(
            id=doc["id"],
            reason=str(doc.get("reason", doc.get("message")) or ""),
            rule=str(rule) if rule is not None else None,
            step=step if isinstance(step, int) and not isinstance(step, bool) else None,
            time=float(when) if isinstance(when, (int, float)) else 0.0,
        )


def write_request(storage: Any, reason: str, rule: str | None = None,
                  step: int | None = None) -> DumpRequest:
    """Ask the hooks writing the trial in ``storage`` to dump their flight recorders (the one
    place that writes ``REQUEST_FILE``: the rule action and ``mltrace dump`` call it).

    Args:
        storage: the trial's storage (``trial.storage`` or ``open_storage(out_dir)``).
        reason: why, shown with the dump (the rule's message, a person's note).
        rule: the rule that asked, None for a person.
        step: the global step the rule fired at, None for a person.

    Returns:
        the request written (its ``id`` names the dump the hooks make for it).

    Raises:
        TypeError: ``reason`` is not a string or ``step`` not an integer.
        OSError, MltraceError: the storage refused the write.
    """
    if not isinstance(reason, str):
        raise TypeError(f"reason={reason!r} must be a string")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise TypeError(f"step={step!r} must be an integer global step or None")
    request = DumpRequest(id=uuid.uuid4().hex, reason=reason, rule=rule, step=step,
                          time=time.time())
    storage.write(REQUEST_FILE, request.to_json())
    return request


def read_request(storage: Any) -> DumpRequest | None:
    """The trial's pending dump request, None when there is none or it cannot be parsed (a
    damaged file is logged as a warning naming it).

    Raises:
        OSError, MltraceError: the storage cannot be read now (the caller asks again later).
    """
    try:  # one read, not a look and a read: hooks ask at every stop-signal look
        return DumpRequest.from_json(storage.read(REQUEST_FILE))
    except FileNotFoundError:  # no request
        return None
    except (ValueError, TypeError) as exc:
        logger.warning("ignoring damaged flight recorder request %s/%s: %s",
                       getattr(storage, "uri", ""), REQUEST_FILE, exc)
        return None
