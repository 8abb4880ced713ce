"""events/ records and index files: mltrace's bytes equal real smdebug 1.0.34's.

smdebug's own ``FileWriter`` writes one tensor (or several) with a fixed timestamp; mltrace's
``frame_record(encode_tensor_event(...))`` must give the very same bytes, and mltrace's index JSON
must equal smdebug's once mltrace's extra per-entry ``crc32c`` field is removed (and be byte-equal
when that field is left out). This is the permanent form of the format contract: docs/format.md,
"Records and CRCs", "Events and tensors" and "Index files".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.core.tfrecord import _crc32c as smd_crc
from smdebug.core.writer import FileWriter

from mltrace.capture.hook import as_numpy
from mltrace.format import paths
from mltrace.format.crc32c import crc32c
from mltrace.format.events import decode_event, encode_tensor_event
from mltrace.format.index import IndexEntry, StepIndex, decode_index, encode_index
from mltrace.format.records import frame_record, iter_records
from mltrace.modes import ModeKeys

WALL_TIME = 1234.5
WORKER = "worker_0"

# (mode, global step, mode step)
PLACES = [
    pytest.param(ModeKeys.GLOBAL, 0, 0, id="GLOBAL-step0"),
    pytest.param(ModeKeys.TRAIN, 9, 7, id="TRAIN-step9-mode_step7"),
    pytest.param(ModeKeys.PREDICT, 1500, 300, id="PREDICT-step1500"),  # index folder 000000001
]

_rng = np.random.default_rng(1234)

# Values smdebug's writer and reader both handle correctly (the cross-checked subset).
READABLE_VALUES = {
    "float16_2d": _rng.standard_normal((3, 4)).astype(np.float16),
    "float32_1d": _rng.standard_normal(7).astype(np.float32),
    "float32_4d": _rng.standard_normal((2, 3, 1, 4)).astype(np.float32),
    "float32_0d": np.array(2.25, dtype=np.float32),
    "float32_special": np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], dtype=np.float32),
    "float64_2d": _rng.standard_normal((5, 2)),
    "float64_0d": np.array(-3.5),
    "int32_2d": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
    "int64_1d": np.array([-(2**62), -1, 0, 1, 2**62], dtype=np.int64),
    "uint8_3d": np.arange(24, dtype=np.uint8).reshape(2, 3, 4) * 10,
    "bool_1d": np.array([True, False, True, True]),
    "bool_2d": np.array([[True, False], [False, True]]),
    "str_1d": np.array(["alpha", "b", ""]),
    "str_unicode_1d": np.array(["héllo", "日本", "x y"]),
    "transposed_f32": np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
    "fortran_f64": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
    "big_f32": _rng.standard_normal((40, 50)).astype(np.float32),  # multi-byte length varints
    "python_float": 0.1,
    "python_int": 42,
    "python_bool": True,
    "numpy_float32_scalar": np.float32(1.5),
    "numpy_int64_scalar": np.int64(-7),
    "list_of_floats": [1.0, 2.0, 3.5],
}

# Values smdebug's *writer* encodes but its reader gets wrong or cannot decode (docs/format.md,
# "What smdebug's reader gets wrong"): the bytes must still match, since mltrace writes the same
# records.
WRITER_ONLY_VALUES = {
    "int8_1d": np.array([-128, -1, 0, 1, 127], dtype=np.int8),
    "int16_2d": np.array([[-300, 2], [3, 30000]], dtype=np.int16),
    "uint16_1d": np.array([0, 1, 65535], dtype=np.uint16),
    "uint32_1d": np.array([0, 1, 2**32 - 1], dtype=np.uint32),
    "uint64_1d": np.array([0, 1, 2**64 - 1], dtype=np.uint64),
    "complex64_1d": np.array([1 + 2j, -3.5j], dtype=np.complex64),
    "complex128_1d": np.array([1 + 2j, -3.5j], dtype=np.complex128),
}

ALL_VALUES = {**READABLE_VALUES, **WRITER_ONLY_VALUES}


def _smd_mode(mode: ModeKeys) -> SmdModeKeys:
    return SmdModeKeys[mode.name]


def _smdebug_write(tmp: Path, step: int, items: list[tuple[str, object]], mode: ModeKeys,
                   mode_step: int) -> tuple[bytes, bytes]:
    """Write ``items`` with smdebug's FileWriter; return (events bytes, index bytes)."""
    fw = FileWriter(trial_dir=str(tmp), step=step, worker=WORKER)
    for name, value in items:
        fw.write_tensor(tdata=value, tname=name, mode=_smd_mode(mode), mode_step=mode_step,
                        timestamp=WALL_TIME)
    fw.close()
    events = (tmp / paths.event_file_key(step, WORKER)).read_bytes()
    index = (tmp / paths.index_file_key(step, WORKER)).read_bytes()
    return events, index


def _mltrace_write(step: int, items: list[tuple[str, object]], mode: ModeKeys,
                   mode_step: int) -> tuple[bytes, StepIndex, list[bytes]]:
    """The same with mltrace's encoders: (events bytes, index, payloads)."""
    buffer = b""
    payloads = []
    index = StepIndex(mode=mode, mode_step=mode_step,
                      event_file_name=paths.event_file_key(step, WORKER))
    for name, value in items:
        payload = encode_tensor_event(name, as_numpy(value), step, mode, mode_step, WALL_TIME)
        record = frame_record(payload)
        index.tensors.append(IndexEntry(name, len(buffer), len(record), crc32c(payload)))
        payloads.append(payload)
        buffer += record
    return buffer, index, payloads


def _without_crc(doc: dict) -> dict:
    out = json.loads(json.dumps(doc))
    for entry in out["tensor_payload"]:
        entry.pop("crc32c")
    return out


@pytest.mark.parametrize(("mode", "step", "mode_step"), PLACES)
@pytest.mark.parametrize("case", sorted(ALL_VALUES))
def test_single_record_bytes_and_index_match(tmp_path, case, mode, step, mode_step):
    value = ALL_VALUES[case]
    name = f"Net_{case}.weight"
    smd_events, smd_index = _smdebug_write(tmp_path, step, [(name, value)], mode, mode_step)
    ml_events, ml_index, payloads = _mltrace_write(step, [(name, value)], mode, mode_step)

    assert ml_events == smd_events, f"{case}: record bytes differ from smdebug's"

    ml_doc = json.loads(encode_index(ml_index))
    assert all(isinstance(e["crc32c"], int) for e in ml_doc["tensor_payload"])
    assert _without_crc(ml_doc) == json.loads(smd_index)
    # Without its extra field, mltrace's index file is byte-identical to smdebug's.
    for entry in ml_index.tensors:
        entry.crc32c = None
    assert encode_index(ml_index) == smd_index


@pytest.mark.parametrize(("mode", "step", "mode_step"), PLACES)
def test_multi_record_file_matches(tmp_path, mode, step, mode_step):
    """Many tensors in one events file: offsets in the index and the concatenated bytes agree."""
    items = [(f"t/{case}", ALL_VALUES[case]) for case in sorted(ALL_VALUES)]
    items.append(("smdebug/reductions/abs_mean/t/float32_1d", np.float32(0.5)))
    smd_events, smd_index = _smdebug_write(tmp_path, step, items, mode, mode_step)
    ml_events, ml_index, payloads = _mltrace_write(step, items, mode, mode_step)

    assert ml_events == smd_events
    ml_doc = json.loads(encode_index(ml_index))
    assert _without_crc(ml_doc) == json.loads(smd_index)

    # mltrace's extra field is the real CRC32C of smdebug's payload (cross-checked against
    # smdebug's own pure-Python CRC32C), and mltrace's parser accepts smdebug's index file.
    parsed = decode_index(smd_index, "smdebug index")
    assert [e.tensorname for e in parsed.tensors] == [n for n, _ in items]
    assert all(e.crc32c is None for e in parsed.tensors)
    assert parsed.mode is mode and parsed.mode_step == mode_step
    assert parsed.event_file_name == paths.event_file_key(step, WORKER)
    for (offset, payload), entry, ml_entry, expected in zip(
        iter_records(smd_events, "smdebug events", check_data="magic"), parsed.tensors,
        ml_index.tensors, payloads,
    ):
        assert offset == entry.start_idx
        assert payload == expected
        assert ml_entry.crc32c == smd_crc.crc32c(payload) == crc32c(payload)


@pytest.mark.parametrize("case", sorted(READABLE_VALUES))
def test_mltrace_decodes_smdebug_records(tmp_path, case):
    """mltrace's event decoder reads smdebug's records back to the value smdebug wrote."""
    value = READABLE_VALUES[case]
    smd_events, _ = _smdebug_write(tmp_path, 9, [("x", value)], ModeKeys.TRAIN, 7)
    ((_, payload),) = list(iter_records(smd_events, "smdebug events", check_data="magic"))
    event = decode_event(payload)
    assert event.step == 9 and event.wall_time == WALL_TIME
    (decoded,) = event.values
    assert decoded.tag == "x" and decoded.mode is ModeKeys.TRAIN and event.mode_step(decoded) == 7
    expected = as_numpy(value)
    assert decoded.tensor.shape == expected.shape
    if expected.dtype.kind == "U":
        assert decoded.tensor.tolist() == expected.tolist()
    else:
        assert decoded.tensor.dtype == expected.dtype
        np.testing.assert_array_equal(decoded.tensor, expected)


@pytest.mark.parametrize("case", sorted(WRITER_ONLY_VALUES))
def test_mltrace_decodes_dtypes_smdebug_reader_gets_wrong(tmp_path, case):
    """int8, int16, uint16/32/64, complex64: smdebug writes them, its reader returns int8 as
    uint8 and fails on the others (docs/format.md); mltrace reads smdebug's bytes exactly."""
    from smdebug.core.reader import FileReader

    value = WRITER_ONLY_VALUES[case]
    smd_events, _ = _smdebug_write(tmp_path, 3, [("x", value)], ModeKeys.TRAIN, 3)
    ((_, payload),) = list(iter_records(smd_events, "smdebug events", check_data="magic"))
    (decoded,) = decode_event(payload).values
    assert decoded.tensor.dtype == value.dtype
    np.testing.assert_array_equal(decoded.tensor, value)

    fname = str(tmp_path / paths.event_file_key(3, WORKER))
    if value.dtype == np.int8:  # smdebug bug: INT8 decoded as uint8
        ((_, _, smd_value, _, _),) = list(FileReader(fname).read_tensors())
        assert smd_value.dtype == np.uint8
        np.testing.assert_array_equal(smd_value, value.view(np.uint8))
    elif value.dtype != np.complex128:  # smdebug's reader has no mapping for these dtypes
        with pytest.raises(KeyError):
            list(FileReader(fname).read_tensors())
