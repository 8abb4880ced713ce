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

import json
from dataclasses import dataclass, field

from mltrace.exceptions import IndexReaderException
from mltrace.modes import ModeKeys


@dataclass
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


def encode_index(index: StepIndex) -> bytes:
    """Serialize ``index`` as smdebug's index JSON (plus the crc32c field of each entry)."""
    meta: dict[str, object] = {"mode": index.mode.name, "mode_step": index.mode_step}
    if index.event_file_name is not None:
        meta["event_file_name"] = index.event_file_name
    tensors = []
    for e in index.tensors:
        entry: dict[str, object] = {"tensorname": e.tensorname, "start_idx": e.start_idx, "length": e.length}
        if e.crc32c is not None:
            entry["crc32c"] = e.crc32c
        tensors.append(entry)
    shapes = [
        {"tensorname": s.tensorname, "originalname": s.originalname or s.tensorname, "shape": list(s.shape)}
        for s in index.shapes
    ]
    return json.dumps({"meta": meta, "tensor_payload": tensors, "shape_payload": shapes}).encode()


def decode_index(data: bytes, where: str) -> StepIndex:
    """Parse index JSON; ``where`` names the file in errors.

    Raises:
        IndexReaderException: empty, non-JSON, or wrongly shaped content.
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IndexReaderException(f"empty or corrupt index file {where}: {exc}") from None
    try:
        meta = doc["meta"]
        if not meta:
            raise KeyError("meta")
        index = StepIndex(
            mode=ModeKeys[meta["mode"]],
            mode_step=int(meta["mode_step"]),
            event_file_name=meta.get("event_file_name"),
        )
        for e in doc.get("tensor_payload") or []:
            crc = e.get("crc32c")
            index.tensors.append(
                IndexEntry(str(e["tensorname"]), int(e["start_idx"]), int(e["length"]),
                           None if crc is None else int(crc))
            )
        for s in doc.get("shape_payload") or []:
            index.shapes.append(
                ShapeEntry(str(s["tensorname"]), tuple(int(x) for x in s["shape"]), s.get("originalname"))
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise IndexReaderException(
            f"index file {where} is not shaped like an smdebug index ({type(exc).__name__}: {exc})"
        ) from None
    if "tensor_payload" not in doc and "shape_payload" not in doc:
        raise IndexReaderException(f"index file {where} has neither tensor_payload nor shape_payload")
    if index.tensors and not index.event_file_name:
        raise IndexReaderException(f"index file {where} lists tensors but no meta.event_file_name")
    return index
