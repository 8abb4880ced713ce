"""Many records of one tensor decoded as one array: what a view of every step reads.

A tensor's records differ from step to step only in the Event's wall time and step, the values
and the mode step that follows them; the bytes from the summary to the values (tag, dtype,
shape, every length) are the same when the record's length is. So the first record of each
(tensor, record length) is decoded in full, and of the others the reader checks what it would
check field by field, in bulk: the payload against the index's CRC32C, and the bytes before the
values against the first record's, the footer for smdebug's fixed data CRC (mltrace's, whose
real payload CRC is in the index); their values are then cut out and turned into one array.
A record that differs anywhere it should not is decoded on its own, so a damaged one fails
exactly as it would alone. Records without an index CRC (smdebug's own trials) are always
decoded on their own: only the CRC proves the rest of the payload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from mltrace.format.crc32c import crc32c_bytes
from mltrace.format.events import find_field
from mltrace.format.records import FOOTER_BYTES, HEADER_BYTES, MAGIC_FOOTER


class RecordPlace(Protocol):
    """What this module needs of a record's index entry (``mltrace.trials.index.Location``):
    its payload's CRC32C (None when the index has none) and the tensor name it is for."""

    @property
    def crc32c(self) -> int | None: ...

    @property
    def tag(self) -> str | None: ...


Location = TypeVar("Location", bound=RecordPlace)
#: Records of one tensor and length below this many are decoded one by one (nothing to gain).
MIN_GROUP = 3


@dataclass(frozen=True)
class _Template:
    """Where the first record of a group keeps its values (payload offsets), and the bytes
    from its summary to them, which every other record of the group must repeat."""

    summary: int
    content: int
    length: int
    prefix: bytes
    dtype: np.dtype
    shape: tuple[int, ...]


def decode_records(records: Sequence[bytes], locations: Sequence[Location],
                   decode_one: Callable[[bytes, Location], np.ndarray]) -> list[np.ndarray]:
    """The arrays of ``records`` (framed, header to footer), in order: groups of one tensor and
    record length in bulk, the rest with ``decode_one`` (the reader's full check of a record,
    which raises for a damaged one: so does this)."""
    out: list[np.ndarray | None] = [None] * len(records)
    groups: dict[tuple[str | None, int], list[int]] = {}
    for i, (record, loc) in enumerate(zip(records, locations)):
        if loc.crc32c is None:
            out[i] = decode_one(record, loc)
        else:
            groups.setdefault((loc.tag, len(record)), []).append(i)
    for members in groups.values():
        if len(members) < MIN_GROUP:
            for i in members:
                out[i] = decode_one(records[i], locations[i])
            continue
        _decode_group(records, locations, members, decode_one, out)
    return out  # type: ignore[return-value]  # every slot filled above


def _decode_group(records: Sequence[bytes], locations: Sequence[Location], members: list[int],
                  decode_one: Callable[[bytes, Location], np.ndarray],
                  out: list[np.ndarray | None]) -> None:
    first = members[0]
    array = out[first] = decode_one(records[first], locations[first])
    template = _template(records[first][HEADER_BYTES:-FOOTER_BYTES], array)
    if template is None:
        for i in members[1:]:
            out[i] = decode_one(records[i], locations[i])
        return
    header = records[first][:HEADER_BYTES]
    start, length, prefix = template.content, template.length, template.prefix
    alike: list[int] = []
    contents: list[bytes] = []
    for i in members[1:]:
        record = records[i]
        payload = record[HEADER_BYTES:-FOOTER_BYTES]
        shift = _summary_start(payload) - template.summary
        at = start + shift
        if (crc32c_bytes(payload) == locations[i].crc32c and record[:HEADER_BYTES] == header
                and record[-FOOTER_BYTES:] == MAGIC_FOOTER and payload[at - len(prefix):at] == prefix):
            alike.append(i)
            contents.append(payload[at:at + length])
        else:  # something else differs: the full check says what, or reads it
            out[i] = decode_one(record, locations[i])
    if not alike:
        return
    values = np.frombuffer(b"".join(contents), dtype=template.dtype.newbyteorder("<"))
    values = values.astype(template.dtype).reshape((len(alike), *template.shape))
    for k, i in enumerate(alike):
        out[i] = values[k, ...]  # an array, 0-d for a scalar (values[k] would be a numpy scalar)


def _template(payload: bytes, array: np.ndarray) -> _Template | None:
    """The template of a group whose first record holds ``array`` in ``payload``; None when its
    values are not one little-endian ``tensor_content`` at the end of its TensorProto (strings,
    bfloat16, typed value lists), which are decoded one by one."""
    if array.dtype.kind not in "biufc":
        return None
    summary = _summary_start(payload)
    found = find_field(payload, summary, len(payload), 5)  # Event.summary
    value = found and find_field(payload, found[0], found[1], 1)  # Summary.value[0]
    tensor = value and find_field(payload, value[0], value[1], 8)  # Value.tensor
    content = tensor and find_field(payload, tensor[0], tensor[1], 4)  # TensorProto.tensor_content
    if not content or content[1] != tensor[1]:  # type: ignore[index]
        return None
    begin, end = content
    if end - begin != array.nbytes or payload[begin:end] != array.astype(
            array.dtype.newbyteorder("<")).tobytes():
        return None
    return _Template(summary, begin, end - begin, payload[summary:begin], array.dtype,
                     array.shape)


def _summary_start(payload: bytes) -> int:
    """Offset of the first field after an Event's wall time and step (they come first, as every
    writer orders them; a record that does not is caught by the prefix comparison)."""
    pos = 9 if payload[:1] == b"\x09" else 0
    if payload[pos:pos + 1] == b"\x10":
        pos += 1
        while pos < len(payload) and payload[pos] & 0x80:
            pos += 1
        pos += 1
    return pos


__all__ = ["MIN_GROUP", "decode_records"]
