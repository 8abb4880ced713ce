"""TFRecord framing, both directions, over bytes in memory.

One record on disk, with no padding between records::

    uint64 length        little-endian, the payload's byte count
    uint32 length_crc    masked CRC32C of the 8 length bytes
    bytes  payload       one serialized Event
    uint32 data_crc      masked CRC32C of the payload (TensorBoard files), or smdebug's fixed
                         MAGIC_DATA_CRC (events/ files; the real CRC then lives in the index)

A record therefore takes ``len(payload) + 16`` bytes, the ``length`` stored in index entries.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence

from mltrace.exceptions import CorruptRecordError
from mltrace.format.crc32c import MAGIC_DATA_CRC, crc32c_extend, mask, masked_crc32c

HEADER_BYTES = 12
FOOTER_BYTES = 4
OVERHEAD_BYTES = HEADER_BYTES + FOOTER_BYTES
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
#: The footer of every events/ record (smdebug's fixed data CRC).
MAGIC_FOOTER = _U32.pack(MAGIC_DATA_CRC)


@functools.lru_cache(maxsize=4096)
def record_header(payload_length: int) -> bytes:
    """The 12 bytes before a payload of ``payload_length`` bytes: its length and length CRC
    (cached: a tensor's records have the same length every step)."""
    length = _U64.pack(payload_length)
    return length + _U32.pack(masked_crc32c(length))


def frame_record(payload: bytes, real_crc: bool = False) -> bytes:
    """Frame ``payload`` as one record; ``real_crc`` picks TensorBoard's footer over smdebug's."""
    footer = _U32.pack(masked_crc32c(payload)) if real_crc else MAGIC_FOOTER
    return record_header(len(payload)) + payload + footer


def frame_parts(parts: Sequence[bytes]) -> list[bytes]:
    """:func:`frame_record` (with the real CRC) of the payload ``b"".join(parts)``, as parts:
    the caller copies each once into its buffer instead of joining the payload first."""
    crc = 0
    for part in parts:
        crc = crc32c_extend(crc, part)
    return [record_header(sum(len(p) for p in parts)), *parts, _U32.pack(mask(crc))]


def unframe_record(record: bytes | memoryview, where: str, check_data: str = "any") -> bytes:
    """Return the payload of exactly one framed record, checking its framing.

    Args:
        record: the record's bytes, header to footer.
        where: names the record in error messages (file and offset).
        check_data: "magic" demands smdebug's fixed data CRC, "real" the payload's masked CRC,
            "any" accepts either (the payload is then checked against the index CRC instead).

    Raises:
        CorruptRecordError: truncated record, bad length CRC or a data CRC that does not match.
    """
    view = memoryview(record)
    if len(view) < OVERHEAD_BYTES:
        raise CorruptRecordError(where, f"truncated record ({len(view)} bytes, need at least 16)")
    (length,) = _U64.unpack_from(view, 0)
    (length_crc,) = _U32.unpack_from(view, 8)
    if masked_crc32c(view[:8]) != length_crc:
        raise CorruptRecordError(where, "length CRC mismatch (the record header is damaged)")
    if len(view) != length + OVERHEAD_BYTES:
        raise CorruptRecordError(
            where, f"record holds {len(view)} bytes but its header says {length + OVERHEAD_BYTES}"
        )
    payload = bytes(view[HEADER_BYTES : HEADER_BYTES + length])
    (data_crc,) = _U32.unpack_from(view, HEADER_BYTES + length)
    if check_data == "magic" and data_crc != MAGIC_DATA_CRC:
        raise CorruptRecordError(where, "data CRC is not smdebug's fixed value")
    if check_data == "real" and data_crc != masked_crc32c(payload):
        raise CorruptRecordError(where, "data CRC mismatch (the payload is damaged)")
    if check_data == "any" and data_crc not in (MAGIC_DATA_CRC, masked_crc32c(payload)):
        raise CorruptRecordError(where, "data CRC mismatch (the payload is damaged)")
    return payload


def iter_records(data: bytes, where: str, check_data: str = "any") -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, payload)`` for each record of a whole file held in ``data``.

    Raises:
        CorruptRecordError: at the first damaged or truncated record (earlier ones were yielded).
    """
    offset = 0
    view = memoryview(data)
    while offset < len(view):
        if len(view) - offset < HEADER_BYTES:
            raise CorruptRecordError(f"{where} at byte {offset}", "truncated record header")
        (length,) = _U64.unpack_from(view, offset)
        (length_crc,) = _U32.unpack_from(view, offset + 8)
        if masked_crc32c(view[offset : offset + 8]) != length_crc:
            raise CorruptRecordError(f"{where} at byte {offset}", "length CRC mismatch")
        end = offset + length + OVERHEAD_BYTES
        if end > len(view):
            raise CorruptRecordError(f"{where} at byte {offset}", "truncated record")
        yield offset, unframe_record(view[offset:end], f"{where} at byte {offset}", check_data)
        offset = end
