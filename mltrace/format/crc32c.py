"""CRC32C (Castagnoli) and TFRecord's masked form, through the C `google-crc32c` package.

The mask exists because TFRecord stores CRCs next to the data they cover; rotating and adding a
constant keeps a CRC of data that itself holds CRCs from being trivially self-consistent.
"""

from __future__ import annotations

from collections.abc import Callable

import google_crc32c

_MASK_DELTA = 0xA282EAD8


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """Return the plain CRC32C of ``data`` (check value of b"123456789" is 0xE3069283)."""
    return google_crc32c.value(data if isinstance(data, bytes) else bytes(data))


#: The CRC32C of what a CRC covered followed by more bytes (a CRC over parts, no join):
#: ``crc32c_extend(crc, data)``; the C function itself, no Python call around it (hot loops).
crc32c_extend: Callable[[int, bytes], int] = google_crc32c.extend
#: :func:`crc32c` of a ``bytes`` object (not a memoryview), the C function itself (hot loops).
crc32c_bytes: Callable[[bytes], int] = google_crc32c.value


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """Return TFRecord's masked CRC32C of ``data``: rotate right by 15 bits, add 0xA282EAD8."""
    return mask(crc32c(data))


def mask(crc: int) -> int:
    """TFRecord's mask of a plain CRC32C (see :func:`masked_crc32c`)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


#: smdebug's events/ files do not checksum payloads: every record's data CRC is the masked CRC of
#: these ten ASCII bytes, and smdebug's reader demands exactly that value. mltrace writes it too and
#: keeps the real payload CRC in the index instead (see index.py).
CHECKSUM_MAGIC_BYTES = b"0x12345678"
MAGIC_DATA_CRC = masked_crc32c(CHECKSUM_MAGIC_BYTES)
