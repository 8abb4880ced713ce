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
from mltrace.format.crc32c import crc32c, crc32c_extend
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
    """Encodes a step's records; keeps, per tensor (name, dtype, shape), the bytes of its
    record between the enclosing messages' lengths and its values. One per writer: the cache
    holds the tensors that writer saw (a model's are the same every step)."""

    def __init__(self) -> None:
        self._heads: dict[tuple[str, np.dtype, tuple[int, ...]], bytes | None] = {}
        self._metadata_of: tuple[ModeKeys, int] | None = None
        self._metadata = b""

    def encode(self, records: Iterable[tuple[str, np.ndarray]], step: int, mode: ModeKeys,
               mode_step: int, wall_time: float) -> EncodedRecords:
        """The framed records of ``records`` (name, value) in the step ``step`` of ``mode``,
        all with ``wall_time``.

        Raises:
            MltraceTypeError: a value of a dtype the format cannot hold (as tensor_event_parts).
        """
        out = EncodedRecords()
        if self._metadata_of != (mode, mode_step):  # the same for every record of a step
            self._metadata_of = (mode, mode_step)
            self._metadata = events.metadata_field(mode, mode_step)
        metadata = self._metadata
        meta_length = len(metadata)
        before: dict[int, bytes] = {}  # value length -> the event's bytes before its value
        heads = self._heads
        for name, array in records:
            key = (name, array.dtype, array.shape)
            if key not in heads:  # a tensor not seen before (None: not a template's)
                heads[key] = _value_head(name, array)
            head = heads[key]
            if head is None:  # text, bfloat16 bits, big-endian: the general encoder
                parts: tuple[bytes, ...] = events.tensor_event_parts(
                    name, array, step, mode, mode_step, wall_time)
                _append_parts(out, name, parts)
                continue
            content = array.tobytes()
            value_length = len(head) + len(content) + meta_length
            prefix = before.get(value_length)
            if prefix is None:
                prefix = before[value_length] = events.heads_before_value(
                    wall_time, step, value_length)
            if len(content) <= JOIN_LIMIT:
                payload = prefix + head + content + metadata
                out.parts.append(record_header(len(payload)) + payload + MAGIC_FOOTER)
                out.names.append(name)
                out.lengths.append(len(payload) + OVERHEAD_BYTES)
                out.crcs.append(crc32c(payload))
            else:
                _append_parts(out, name, (prefix + head, content, metadata))
        return out


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


def _value_head(name: str, array: np.ndarray) -> bytes | None:
    """The Summary.Value bytes of ``name`` before a numeric ``array``'s values (its tag, the
    tensor's key and length, the tensor's dtype, shape and content key), or None for a value
    the template does not cover: text, bfloat16 bits, a byte order other than little-endian,
    an empty array (no content field)."""
    dtype = array.dtype
    if (dtype.kind not in "biufc" or isinstance(array, tensors.BFloat16Bits) or not array.size
            or dtype.byteorder == ">" or (dtype.byteorder == "=" and not _LITTLE)):
        return None
    tensor_head = tensors.numeric_tensor_head(
        name, tensors.dtype_code(array), array.shape, array.nbytes)
    return events.value_head(name, tensor_head, array.nbytes)


_LITTLE = np.dtype("=i4").str.startswith("<")
