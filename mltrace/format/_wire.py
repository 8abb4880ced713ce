"""The few protobuf wire primitives mltrace needs, written by hand (no protobuf dependency: its version pins were smdebug's most reported breakage; docs/format.md).

Wire format facts used here: a field key is ``(field_number << 3) | wire_type`` as a varint;
wire types 0 (varint), 1 (fixed64), 2 (length-delimited), 5 (fixed32). Python's protobuf writes
fields in field-number order and omits proto3 defaults, and encoders in events.py follow that
order so their bytes equal protobuf's.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from mltrace.exceptions import MltraceValueError

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
_F64 = struct.Struct("<d")
_F32 = struct.Struct("<f")
_SMALL = [bytes((i,)) for i in range(0x80)]


class WireError(MltraceValueError):
    """Bytes that do not parse as the protobuf message expected (a damaged or foreign record);
    an MltraceError, so that readers of damaged files raise only mltrace's exceptions."""


def varint(value: int) -> bytes:
    """Encode a non-negative int (or a negative int64, as protobuf does: 10 bytes)."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    """Encode a field key."""
    return varint((field << 3) | wire_type)


def len_field(field: int, payload: bytes) -> bytes:
    """Encode a length-delimited field (string, bytes, sub-message, packed repeated)."""
    return key(field, LEN) + varint(len(payload)) + payload


def double_field(field: int, value: float) -> bytes:
    """Encode a fixed64 double field."""
    return key(field, FIXED64) + _F64.pack(value)


def float_field(field: int, value: float) -> bytes:
    """Encode a fixed32 float field."""
    return key(field, FIXED32) + _F32.pack(value)


def varint_field(field: int, value: int) -> bytes:
    """Encode a varint field (int32, int64, enum, bool)."""
    return key(field, VARINT) + varint(value)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; return (value, next position)."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def signed64(value: int) -> int:
    """Reinterpret a decoded varint as int64 (protobuf encodes negatives as 2**64 - x)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """Yield ``(field_number, wire_type, value)`` for each field of a message.

    The value is an int for varints, a memoryview for length-delimited fields, and the raw
    8 or 4 bytes (as memoryview) for fixed-width fields.
    """
    view = memoryview(data)
    pos = 0
    end = len(view)
    while pos < end:
        tag, pos = read_varint(view, pos)
        field, wire_type = tag >> 3, tag & 7
        if wire_type == VARINT:
            value, pos = read_varint(view, pos)
            yield field, wire_type, value
        elif wire_type == LEN:
            length, pos = read_varint(view, pos)
            if pos + length > end:
                raise WireError(f"field {field} runs past the end of the message")
            yield field, wire_type, view[pos : pos + length]
            pos += length
        elif wire_type == FIXED64:
            if pos + 8 > end:
                raise WireError("truncated fixed64")
            yield field, wire_type, view[pos : pos + 8]
            pos += 8
        elif wire_type == FIXED32:
            if pos + 4 > end:
                raise WireError("truncated fixed32")
            yield field, wire_type, view[pos : pos + 4]
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type} for field {field}")


def as_double(raw: memoryview) -> float:
    """Decode fixed64 bytes as a double."""
    return _F64.unpack(raw)[0]


def as_float(raw: memoryview) -> float:
    """Decode fixed32 bytes as a float."""
    return _F32.unpack(raw)[0]
