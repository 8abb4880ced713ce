"""Record framing and CRCs, checked against the byte values smdebug and TFRecord put on disk."""

from __future__ import annotations

import struct

import pytest

from mltrace.exceptions import CorruptRecordError
from mltrace.format.crc32c import CHECKSUM_MAGIC_BYTES, MAGIC_DATA_CRC, crc32c, masked_crc32c
from mltrace.format.records import (
    HEADER_BYTES,
    OVERHEAD_BYTES,
    frame_record,
    iter_records,
    unframe_record,
)

WHERE = "events/000000000010/000000000010_worker_0.tfevents"


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_crc32c_accepts_bytes_bytearray_and_memoryview():
    expected = crc32c(b"123456789")
    assert crc32c(bytearray(b"123456789")) == expected
    assert crc32c(memoryview(b"xx123456789")[2:]) == expected


def test_masked_crc32c_is_tfrecords_rotation_plus_delta():
    crc = 0xE3069283
    expected = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc32c(b"123456789") == expected


def test_magic_data_crc_matches_smdebug_bytes_on_disk():
    assert CHECKSUM_MAGIC_BYTES == b"0x12345678"
    assert MAGIC_DATA_CRC == 0x062DC0B3
    assert struct.pack("<I", MAGIC_DATA_CRC) == bytes.fromhex("b3c02d06")


@pytest.mark.parametrize(
    ("length", "header_hex"),
    [
        (0, "0000000000000000" + "29039807"),
        (100, "6400000000000000" + "435f1cdf"),
    ],
)
def test_record_header_bytes_match_smdebug(length, header_hex):
    record = frame_record(b"\x07" * length)
    assert record[:HEADER_BYTES] == bytes.fromhex(header_hex)


def test_frame_record_layout_with_magic_footer():
    payload = b"an event payload"
    record = frame_record(payload)
    assert len(record) == len(payload) + OVERHEAD_BYTES == len(payload) + 16
    assert struct.unpack_from("<Q", record, 0)[0] == len(payload)
    assert struct.unpack_from("<I", record, 8)[0] == masked_crc32c(record[:8])
    assert record[12:-4] == payload
    assert record[-4:] == bytes.fromhex("b3c02d06")


def test_frame_record_real_crc_footer():
    payload = b"tensorboard payload"
    record = frame_record(payload, real_crc=True)
    assert struct.unpack("<I", record[-4:])[0] == masked_crc32c(payload)
    assert record[:-4] == frame_record(payload)[:-4]


@pytest.mark.parametrize("payload", [b"", b"x", bytes(range(256)) * 5])
@pytest.mark.parametrize("real_crc", [False, True])
def test_frame_unframe_round_trip(payload, real_crc):
    record = frame_record(payload, real_crc=real_crc)
    assert unframe_record(record, WHERE) == payload
    assert unframe_record(memoryview(record), WHERE, check_data="any") == payload


def test_check_data_modes_demand_the_matching_footer():
    payload = b"payload"
    magic = frame_record(payload)
    real = frame_record(payload, real_crc=True)
    assert unframe_record(magic, WHERE, check_data="magic") == payload
    assert unframe_record(real, WHERE, check_data="real") == payload
    with pytest.raises(CorruptRecordError, match="smdebug's fixed value"):
        unframe_record(real, WHERE, check_data="magic")
    with pytest.raises(CorruptRecordError, match="data CRC mismatch"):
        unframe_record(magic, WHERE, check_data="real")


@pytest.mark.parametrize("cut", [0, 1, 11, 12, 15])
def test_unframe_truncated_record_names_location(cut):
    record = frame_record(b"0123456789")[:cut]
    with pytest.raises(CorruptRecordError) as info:
        unframe_record(record, WHERE)
    assert info.value.where == WHERE
    assert WHERE in str(info.value)
    assert "truncated" in info.value.problem


def test_unframe_record_shorter_than_its_header_says():
    record = frame_record(b"0123456789")[:-1]
    with pytest.raises(CorruptRecordError, match=r"holds 25 bytes but its header says 26") as info:
        unframe_record(record, WHERE)
    assert WHERE in str(info.value)


def test_unframe_record_with_trailing_bytes_is_rejected():
    with pytest.raises(CorruptRecordError, match="header says 26"):
        unframe_record(frame_record(b"0123456789") + b"\x00", WHERE)


@pytest.mark.parametrize("byte", range(8))
def test_flipped_length_byte_fails_length_crc(byte):
    record = bytearray(frame_record(b"0123456789"))
    record[byte] ^= 0x01
    with pytest.raises(CorruptRecordError, match="length CRC mismatch") as info:
        unframe_record(bytes(record), WHERE)
    assert WHERE in str(info.value)


def test_flipped_length_crc_byte_is_detected():
    record = bytearray(frame_record(b"0123456789"))
    record[9] ^= 0x80
    with pytest.raises(CorruptRecordError, match="length CRC mismatch"):
        unframe_record(bytes(record), WHERE)


@pytest.mark.parametrize("check_data", ["any", "real"])
def test_flipped_payload_byte_with_real_crc_is_detected(check_data):
    record = bytearray(frame_record(b"0123456789", real_crc=True))
    record[HEADER_BYTES + 3] ^= 0x40
    with pytest.raises(CorruptRecordError, match="data CRC mismatch") as info:
        unframe_record(bytes(record), WHERE, check_data=check_data)
    assert info.value.where == WHERE
    assert WHERE in str(info.value)


def test_corrupt_record_error_is_a_value_error_with_a_fix():
    with pytest.raises(ValueError, match="delete or restore it"):
        unframe_record(b"", WHERE)


def _file(payloads, real_crc=False):
    return b"".join(frame_record(p, real_crc=real_crc) for p in payloads)


def test_iter_records_yields_offsets_and_payloads():
    payloads = [b"first", b"", b"third record" * 10, b"4"]
    data = _file(payloads)
    got = list(iter_records(data, WHERE))
    offsets, offset = [], 0
    for p in payloads:
        offsets.append(offset)
        offset += len(p) + OVERHEAD_BYTES
    assert got == list(zip(offsets, payloads, strict=True))


def test_iter_records_of_empty_file_yields_nothing():
    assert list(iter_records(b"", WHERE)) == []


def test_iter_records_mixed_footers_under_any():
    data = frame_record(b"a") + frame_record(b"b", real_crc=True)
    assert [p for _, p in iter_records(data, WHERE)] == [b"a", b"b"]
    with pytest.raises(CorruptRecordError, match="at byte 17"):
        list(iter_records(data, WHERE, check_data="magic"))


def _collect_until_error(data):
    seen = []
    with pytest.raises(CorruptRecordError) as info:
        seen.extend(iter_records(data, WHERE))  # keeps what was yielded before the error
    return seen, info.value


@pytest.mark.parametrize("cut", [1, 5, 12, 13, 20, 30, 35])
def test_iter_records_over_file_cut_short(cut):
    payloads = [b"one", b"two", b"three" * 4]
    data = _file(payloads)
    last_offset = len(_file(payloads[:2]))
    seen, err = _collect_until_error(data[: len(data) - cut])
    assert seen == [(0, b"one"), (19, b"two")]
    assert err.where == f"{WHERE} at byte {last_offset}"
    assert f"{WHERE} at byte {last_offset}" in str(err)
    assert "truncated" in err.problem


def test_iter_records_flipped_length_byte_in_second_record():
    data = bytearray(_file([b"one", b"two", b"three"]))
    data[19 + 2] ^= 0xFF
    seen, err = _collect_until_error(bytes(data))
    assert seen == [(0, b"one")]
    assert "at byte 19" in str(err)
    assert "length CRC mismatch" in err.problem


def test_iter_records_flipped_payload_byte_with_real_crc():
    data = bytearray(_file([b"one", b"two", b"three"], real_crc=True))
    data[38 + HEADER_BYTES] ^= 0x01
    seen, err = _collect_until_error(bytes(data))
    assert [p for _, p in seen] == [b"one", b"two"]
    assert err.where == f"{WHERE} at byte 38"
    assert "data CRC mismatch" in err.problem
