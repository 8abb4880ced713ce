"""Index files: which records an events file holds, where, and (mltrace's addition) their CRCs.

An index file is JSON written once, beside one events file::

    {"meta": {"mode": "TRAIN", "mode_step": 7, "event_file_name": "events/.../..._worker_0.tfevents"},
     "tensor_payload": [{"tensorname": "fc1.weight", "start_idx": 0, "length": 276,
                         "crc32c": 1234567}, ...],
     "shape_payload": [{"tensorname": "fc1.weight", "originalname": "fc1.weight", "shape": [4, 2]}]}

``start_idx`` and ``length`` cover the whole framed record (header + payload + footer). ``crc32c``
is the plain CRC32C of the record's payload: smdebug's reader reads entries by key and ignores it,
and mltrace's reader checks every payload against it (events/ records carry smdebug's fixed data
CRC, which proves nothing). Index files are written with json.dumps' default separators, as smdebug.
The global step comes from the file name, mode and mode step from ``meta``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mltrace.exceptions import IndexReaderException
from mltrace.format.records import OVERHEAD_BYTES
from mltrace.modes import ModeKeys

if TYPE_CHECKING:
    from mltrace.format.event_batch import EncodedRecords


@dataclass(slots=True)
class IndexEntry:
    """Where one record lives: name, byte range and payload CRC (None in smdebug's own files)."""

    tensorname: str
    start_idx: int
    length: int
    crc32c: int | None = None


@dataclass
class ShapeEntry:
    """A saved shape (ReductionConfig(save_shape=True)); no record backs it."""

    tensorname: str
    shape: tuple[int, ...]
    originalname: str | None = None


@dataclass
class StepIndex:
    """The parsed content of one index file."""

    mode: ModeKeys
    mode_step: int
    event_file_name: str | None
    tensors: list[IndexEntry] = field(default_factory=list)
    shapes: list[ShapeEntry] = field(default_factory=list)


def encode_index(index: StepIndex, records: EncodedRecords | None = None) -> bytes:
    """Serialize ``index`` as smdebug's index JSON (plus the crc32c field of each entry): the
    bytes ``json.dumps`` gives for the dict, built from each name's cached JSON (a step's index is
    encoded on the training thread, and the same names recur every step). With ``records``
    (the step's events file, in order) the entries are theirs, offsets counted from the file's
    start, instead of ``index.tensors``: the same bytes, no IndexEntry made per record."""
    meta = f'{{"mode": "{index.mode.name}", "mode_step": {index.mode_step}'
    if index.event_file_name is not None:
        meta += f', "event_file_name": {json.dumps(index.event_file_name)}'
    entries = []
    if records is None:
        for e in index.tensors:
            tail = "}" if e.crc32c is None else f', "crc32c": {e.crc32c}}}'
            entries.append(f'{_entry_head(e.tensorname)}{e.start_idx}, "length": {e.length}{tail}')
    else:
        offset = 0
        for name, length, crc in zip(records.names, records.lengths, records.crcs):
            entries.append(f'{_entry_head(name)}{offset}, "length": {length}, "crc32c": {crc}}}')
            offset += length
    shapes = json.dumps([
        {"tensorname": s.tensorname, "originalname": s.originalname or s.tensorname, "shape": list(s.shape)}
        for s in index.shapes
    ]) if index.shapes else "[]"
    return (f'{{"meta": {meta}}}, "tensor_payload": [{", ".join(entries)}], '
            f'"shape_payload": {shapes}}}').encode()


@functools.lru_cache(maxsize=4096)
def _entry_head(name: str) -> str:
    return f'{{"tensorname": {json.dumps(name)}, "start_idx": '


def _count(value: object, what: str, minimum: int = 0) -> int:
    """A whole number >= ``minimum`` (an int, or a decimal string as some writers use), else
    ValueError: floats, bools, infinities and negative offsets are damage, not positions."""
    if type(value) is int and minimum <= value < 1 << 63:  # the common case, three per record
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{what}={value!r} is not a whole number")
    number = int(value)
    if not minimum <= number < 1 << 63:  # int64 in every writer
        raise ValueError(f"{what}={number} is out of range")
    return number


#: Names already checked: the same names come back in every index file of a trial.
_CHECKED_NAMES: set[str] = set()


def _name(value: object, what: str) -> str:
    """A string that UTF-8 can encode, as every writer's names are (JSON allows lone surrogates,
    which would fail later, in a record's tag check or when printed), else ValueError."""
    if type(value) is str and value in _CHECKED_NAMES:
        return value
    if not isinstance(value, str):
        raise ValueError(f"{what}={value!r} is not a string")
    value.encode("utf-8")  # UnicodeEncodeError is a ValueError
    if len(_CHECKED_NAMES) < 1 << 16:
        _CHECKED_NAMES.add(value)
    return value


def _key(value: object, what: str) -> str:
    """A storage key relative to the trial: a non-empty string without empty, '.' or '..' parts."""
    key = _name(value, what)
    if key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"{what}={key!r} is not a file of the trial")
    return key


def _entry(e: dict) -> IndexEntry:
    """One record's entry, checked; the common case (whole numbers in range, a name already
    checked) in one expression, since a large trial has millions of them."""
    name, start, length, crc = e["tensorname"], e["start_idx"], e["length"], e.get("crc32c")
    if (type(start) is int and type(length) is int and 0 <= start < 1 << 63
            and OVERHEAD_BYTES <= length < 1 << 63
            and (crc is None or (type(crc) is int and 0 <= crc < 1 << 32))
            and type(name) is str and name in _CHECKED_NAMES):
        return IndexEntry(name, start, length, crc)
    return _entry_checked(e)


def _entry_checked(e: dict) -> IndexEntry:
    """One record's entry, each field checked apart (a string number, a new name, an error)."""
    crc = e.get("crc32c")
    if crc is not None and _count(crc, "crc32c") >= 1 << 32:
        raise ValueError(f"crc32c={crc!r} does not fit 32 bits")
    return IndexEntry(_name(e["tensorname"], "tensorname"), _count(e["start_idx"], "start_idx"),
                      _count(e["length"], "length", OVERHEAD_BYTES),
                      None if crc is None else int(crc))


def _shape(s: dict) -> ShapeEntry:
    if not isinstance(s["shape"], list):
        raise ValueError(f"shape={s['shape']!r} is not a list")
    original = s.get("originalname")
    return ShapeEntry(_name(s["tensorname"], "tensorname"),
                      tuple(_count(x, "shape") for x in s["shape"]),
                      _name(original, "originalname") if original is not None else None)


def decode_index(data: bytes, where: str) -> StepIndex:
    """Parse index JSON; ``where`` names the file in errors.

    Every field is checked (offsets and lengths are whole numbers, a record at least 16 bytes,
    CRCs 32-bit, the events file a relative key), so that a damaged index is rejected here
    rather than read as wrong positions later.

    Raises:
        IndexReaderException: empty, non-JSON, or wrongly shaped content.
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise IndexReaderException(f"empty or corrupt index file {where}: "
                                   f"{type(exc).__name__}: {exc}; delete or restore it") from None
    try:
        meta = doc["meta"]
        if not meta:
            raise KeyError("meta")
        mode_step = meta["mode_step"]
        if isinstance(mode_step, bool) or not isinstance(mode_step, (int, str)):
            raise ValueError(f"mode_step={mode_step!r} is not a whole number")
        event_file = meta.get("event_file_name")
        index = StepIndex(
            mode=ModeKeys[meta["mode"]],
            mode_step=int(mode_step),
            event_file_name=None if event_file is None else _key(event_file, "event_file_name"),
        )
        index.tensors = [_entry(e) for e in doc.get("tensor_payload") or []]
        index.shapes = [_shape(s) for s in doc.get("shape_payload") or []]
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise IndexReaderException(
            f"index file {where} is not shaped like an smdebug index "
            f"({type(exc).__name__}: {exc}); delete or restore it"
        ) from None
    if "tensor_payload" not in doc and "shape_payload" not in doc:
        raise IndexReaderException(f"index file {where} has neither tensor_payload nor shape_payload")
    if index.tensors and not index.event_file_name:
        raise IndexReaderException(f"index file {where} lists tensors but no meta.event_file_name")
    return index
