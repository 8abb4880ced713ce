"""A step's tensor records encoded together, from templates: the bytes of
:func:`mltrace.format.events.tensor_event_parts`, framed, for many tensors at a time.

A tensor's record is the same bytes every step but for the step, the wall time, the mode step
and its values; a transformer's step saves hundreds of them (five reductions of every weight,
bias and gradient are over 500 one-number records). Built field by field in Python, each record
costs tens of microseconds; here the bytes around a tensor's values are built once per tensor
(name, dtype, shape) and once per step (step, wall time, mode step), so a record is a few joins
of cached bytes and one CRC32C in C. The bytes are the same as ``tensor_event_parts``' for the
same inputs (tests/format/test_event_batch.py holds them to it over every dtype).

Records whose values are small (the reductions, a loss) are joined into one bytes object, which
the writer hands on as one part; larger values stay a part of their own, so that they are not
copied once more on the training thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from mltrace.format import events, tensors
from mltrace.format.crc32c import crc32c_bytes, crc32c_extend
from mltrace.format.records import MAGIC_FOOTER, OVERHEAD_BYTES, record_header
from mltrace.modes import ModeKeys

#: Values up to this many bytes are joined into their record (one part per record).
JOIN_LIMIT = 256


@dataclass
class EncodedRecords:
    """Framed records, ready to append to an events file: ``parts`` in order, and per record
    its tensor name, framed length and payload CRC32C (an index entry's fields but the offset)."""

    parts: list[bytes] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    crcs: list[int] = field(default_factory=list)


class EventBatchEncoder:
    """Encodes a step's records; keeps, per tensor (name, dtype, shape) and length of the
    metadata after its values, the bytes of its record between the Event's own fields (wall
    time, step) and its values. One per writer: the cache holds the tensors that writer saw (a
    model's are the same every step)."""

    def __init__(self) -> None:
        self._tails: dict[tuple[str, np.dtype, tuple[int, ...], int], bytes | None] = {}
        self._metadata_of: tuple[ModeKeys, int] | None = None
        self._metadata = b""
        self._fields_of: tuple[float, int] | None = None
        self._fields = b""

    def encode(self, records: Iterable[tuple[str, np.ndarray]], step: int, mode: ModeKeys,
               mode_step: int, wall_time: float, out: EncodedRecords | None = None) -> EncodedRecords:
        """The framed records of ``records`` (name, value) in the step ``step`` of ``mode``,
        all with ``wall_time``, appended to ``out`` (a new EncodedRecords if None).

        Raises:
            MltraceTypeError: a value of a dtype the format cannot hold (as tensor_event_parts).
        """
        if out is None:
            out = EncodedRecords()
        if self._metadata_of != (mode, mode_step):  # the same for every record of a step
            self._metadata_of = (mode, mode_step)
            self._metadata = events.metadata_field(mode, mode_step)
        if self._fields_of != (wall_time, step):
            self._fields_of = (wall_time, step)
            self._fields = events.event_fields(wall_time, step)
        metadata, fields = self._metadata, self._fields
        meta_length = len(metadata)
        around = len(fields) + meta_length  # a payload's bytes besides its tail and values
        tails = self._tails
        parts, names, lengths, crcs = out.parts, out.names, out.lengths, out.crcs
        for name, array in records:
            key = (name, array.dtype, array.shape, meta_length)
            tail = tails.get(key, _UNSEEN)
            if tail is _UNSEEN:  # a tensor not seen before (None: not a template's)
                tail = tails[key] = _tail(name, array, meta_length)
            if tail is None:  # text, bfloat16 bits, big-endian: the general encoder
                _append_parts(out, name, events.tensor_event_parts(
                    name, array, step, mode, mode_step, wall_time))
                continue
            content = array.tobytes()
            length = around + len(tail) + len(content)
            if len(content) <= JOIN_LIMIT:
                payload = b"".join((fields, tail, content, metadata))
                parts.append(b"".join((record_header(length), payload, MAGIC_FOOTER)))
                crcs.append(crc32c_bytes(payload))
            else:
                first = fields + tail
                parts += (record_header(length), first, content, metadata, MAGIC_FOOTER)
                crcs.append(crc32c_extend(crc32c_extend(crc32c_bytes(first), content), metadata))
            names.append(name)
            lengths.append(length + OVERHEAD_BYTES)
        return out


_UNSEEN = b"unseen"  # a sentinel no tail equals (a tail starts with the summary's key)


def _append_parts(out: EncodedRecords, name: str, parts: tuple[bytes, ...]) -> None:
    """One record from its payload's parts, the values not joined (nor copied) here."""
    length = sum(len(p) for p in parts)
    crc = 0
    for part in parts:
        crc = crc32c_extend(crc, part)
    out.parts += (record_header(length), *parts, MAGIC_FOOTER)
    out.names.append(name)
    out.lengths.append(length + OVERHEAD_BYTES)
    out.crcs.append(crc)


def _tail(name: str, array: np.ndarray, meta_length: int) -> bytes | None:
    """The bytes of ``name``'s record between the Event's own fields and a numeric ``array``'s
    values, when the metadata after them is ``meta_length`` bytes: the summary's key and length,
    the value's key and length, its tag, the tensor's key and length, dtype, shape and content
    key. None for a value the template does not cover: text, bfloat16 bits, a byte order other
    than little-endian, an empty array (no content field)."""
    dtype = array.dtype
    if (dtype.kind not in "biufc" or isinstance(array, tensors.BFloat16Bits) or not array.size
            or dtype.byteorder == ">" or (dtype.byteorder == "=" and not _LITTLE)):
        return None
    tensor_head = tensors.numeric_tensor_head(
        name, tensors.dtype_code(array), array.shape, array.nbytes)
    head = events.value_head(name, tensor_head, array.nbytes)
    return events.summary_head(len(head) + array.nbytes + meta_length) + head


_LITTLE = np.dtype("=i4").str.startswith("<")
