"""TensorProto and Event encoding, round trips, and cross-checks with TensorBoard's protos."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, tensor_pb2, types_pb2

from mltrace.exceptions import MltraceTypeError
from mltrace.format import _wire, tensors
from mltrace.format.events import decode_event, encode_scalar_event, encode_tensor_event
from mltrace.format.tensors import BFloat16Bits, decode_tensor, encode_tensor
from mltrace.modes import ModeKeys

NUMERIC_DTYPES = [
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "complex64",
    "complex128",
    "bool",
]
TB_DTYPE = {
    "float16": types_pb2.DT_HALF,
    "float32": types_pb2.DT_FLOAT,
    "float64": types_pb2.DT_DOUBLE,
    "int8": types_pb2.DT_INT8,
    "int16": types_pb2.DT_INT16,
    "int32": types_pb2.DT_INT32,
    "int64": types_pb2.DT_INT64,
    "uint8": types_pb2.DT_UINT8,
    "uint16": types_pb2.DT_UINT16,
    "uint32": types_pb2.DT_UINT32,
    "uint64": types_pb2.DT_UINT64,
    "complex64": types_pb2.DT_COMPLEX64,
    "complex128": types_pb2.DT_COMPLEX128,
    "bool": types_pb2.DT_BOOL,
}
SHAPES = [(), (1,), (5,), (2, 3), (2, 1, 3, 2), (0,), (3, 0)]
BF16_VALUES = [1.0, -2.0, 0.5, 3.140625, -0.0, 65280.0, float("inf")]
BF16_BITS = [0x3F80, 0xC000, 0x3F00, 0x4049, 0x8000, 0x477F, 0x7F80]


def sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values that use the dtype's range (negatives, extremes, fractions) where it has one."""
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        flat = np.arange(n) % 3 == 0
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = np.array([info.min, info.max, 0, 1, info.max - 1] * (n // 5 + 1), dtype=dt)[:n]
    elif dt.kind == "c":
        flat = (np.arange(n) - 2.5) + 1j * (np.arange(n) * 0.25)
    else:
        flat = (np.arange(n) - 2.25) * 1.5
    return np.asarray(flat, dtype=dt).reshape(shape)


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_numeric_round_trip(dtype, shape):
    array = sample(dtype, shape)
    assert_same_array(decode_tensor(encode_tensor("t", array)), array)


def test_int8_stays_int8():
    # smdebug's reader turned int8 into uint8; -1 must stay -1.
    got = decode_tensor(encode_tensor("t", np.array([-1, -128, 127], dtype=np.int8)))
    assert got.dtype == np.int8
    assert got.tolist() == [-1, -128, 127]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "int64", "uint32", "complex128"])
def test_big_endian_input_is_stored_little_endian(dtype):
    native = sample(dtype, (2, 3))
    big = native.astype(np.dtype(dtype).newbyteorder(">"))
    encoded = encode_tensor("t", big)
    assert encoded == encode_tensor("t", native)
    got = decode_tensor(encoded)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, native)


def test_non_contiguous_input_is_stored_in_c_order():
    array = np.arange(12, dtype=np.float32).reshape(3, 4).T
    assert not array.flags.c_contiguous
    assert_same_array(decode_tensor(encode_tensor("t", array)), array)
    assert encode_tensor("t", array) == encode_tensor("t", np.ascontiguousarray(array))


def test_zero_d_has_no_dims_and_one_d_one():
    zero_d = tensor_pb2.TensorProto.FromString(encode_tensor("loss", np.array(2.5, np.float32)))
    assert list(zero_d.tensor_shape.dim) == []
    one_d = tensor_pb2.TensorProto.FromString(encode_tensor("loss", np.array([2.5], np.float32)))
    assert [(d.size, d.name) for d in one_d.tensor_shape.dim] == [(1, "loss_1")]


@pytest.mark.parametrize(
    "array",
    [
        np.array("héllo"),
        np.array(["a", "bc", ""]),
        np.array([["ü", "ab"], ["日本", "x"]]),
        np.array(["α", "β", "γ", "δ", "ε", "ζ"]).reshape(1, 2, 3),
        np.array([["a", "bc"], ["d", "e"]], dtype=object),
    ],
    ids=["0d", "1d", "2d", "3d", "object-2d"],
)
def test_unicode_strings_round_trip(array):
    got = decode_tensor(encode_tensor("names", array))
    assert got.dtype.kind == "U"
    assert got.shape == array.shape
    assert got.tolist() == array.tolist()


def test_strings_are_written_as_smdebug_does():
    proto = tensor_pb2.TensorProto.FromString(encode_tensor("s", np.array([["a", "é"]])))
    assert proto.dtype == types_pb2.DT_INVALID  # smdebug leaves dtype unset for strings
    assert list(proto.string_val) == [b"a", "é".encode()]
    assert [d.size for d in proto.tensor_shape.dim] == [1, 2]


def _as_bytes(values: list) -> list[bytes]:
    return [v.encode("utf-8") if isinstance(v, str) else v for v in values]


def test_ascii_bytes_strings_round_trip():
    array = np.array([[b"ab", b"c"], [b"", b"xyz"]])
    got = decode_tensor(encode_tensor("b", array))
    assert got.shape == array.shape
    assert _as_bytes(got.reshape(-1).tolist()) == array.reshape(-1).tolist()


def test_non_utf8_bytes_strings_round_trip():
    # encode_tensor accepts any bytes; what it writes must read back, not crash the reader.
    array = np.array([b"\xff\xfe", b"ok", b"\x00\x80"])
    got = decode_tensor(encode_tensor("b", array))
    assert got.shape == array.shape
    assert _as_bytes(got.tolist()) == array.tolist()


def test_bfloat16_from_ml_dtypes_round_trip():
    array = np.array(BF16_VALUES, dtype=ml_dtypes.bfloat16).reshape(7, 1)
    encoded = encode_tensor("bf", array)
    proto = tensor_pb2.TensorProto.FromString(encoded)
    assert proto.dtype == types_pb2.DT_BFLOAT16
    assert proto.tensor_content == np.array(BF16_BITS, dtype="<u2").tobytes()
    got = decode_tensor(encoded)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert got.shape == (7, 1)
    np.testing.assert_array_equal(got.astype(np.float32).ravel(), np.array(BF16_VALUES, np.float32))


def test_bfloat16_bits_and_ml_dtypes_encode_identically():
    bits = np.array(BF16_BITS, dtype=np.uint16).view(BFloat16Bits)
    from_ml = np.array(BF16_VALUES, dtype=ml_dtypes.bfloat16)
    assert encode_tensor("bf", bits) == encode_tensor("bf", from_ml)


def test_bfloat16_bits_view_round_trip():
    bits = np.array(BF16_BITS, dtype=np.uint16).reshape(7, 1).view(BFloat16Bits)
    proto = tensor_pb2.TensorProto.FromString(encode_tensor("bf", bits))
    assert proto.dtype == types_pb2.DT_BFLOAT16
    assert [d.size for d in proto.tensor_shape.dim] == [7, 1]
    got = decode_tensor(encode_tensor("bf", bits))
    assert got.shape == (7, 1)
    np.testing.assert_array_equal(got.astype(np.float32).ravel(), np.array(BF16_VALUES, np.float32))


def test_bfloat16_reads_as_exact_float32_without_ml_dtypes(monkeypatch):
    monkeypatch.setattr(tensors, "bfloat16_dtype", lambda: None)
    bits = np.array(BF16_BITS, dtype=np.uint16).view(BFloat16Bits)
    got = decode_tensor(encode_tensor("bf", bits))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(BF16_VALUES, np.float32))


def test_bfloat16_bits_to_float32():
    bits = np.array(BF16_BITS, dtype=np.uint16).view(BFloat16Bits)
    np.testing.assert_array_equal(bits.to_float32(), np.array(BF16_VALUES, np.float32))


@pytest.mark.parametrize(
    ("array", "names"),
    [
        (np.array([1, None], dtype=object), ["NoneType", "int"]),
        (np.array([{"a": 1}, "s"], dtype=object), ["dict"]),
        (np.array([1.5, 2.5], dtype=object), ["float"]),
    ],
)
def test_object_arrays_of_non_strings_are_rejected(array, names):
    with pytest.raises(MltraceTypeError) as info:
        encode_tensor("obj", array)
    message = str(info.value)
    assert "object array" in message
    for name in names:
        assert name in message
    assert "convert" in message


@pytest.mark.parametrize(
    ("array", "words"),
    [
        (np.array(["2020-01-01"], dtype="datetime64[D]"), ["datetime64[D]", "datetime"]),
        (np.array([1, 2], dtype="timedelta64[s]"), ["timedelta64[s]", "timedelta"]),
        (np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]), ["('a', '<i4')", "structured"]),
    ],
    ids=["datetime", "timedelta", "structured"],
)
def test_datetime_and_structured_arrays_are_rejected(array, words):
    with pytest.raises(MltraceTypeError) as info:
        encode_tensor("bad_tensor", array)
    message = str(info.value)
    assert "bad_tensor" in message
    for word in words:
        assert word in message
    assert "convert" in message
    assert isinstance(info.value, TypeError)


def test_unknown_dtype_code_is_a_clear_error():
    data = _wire.varint_field(1, 20) + _wire.len_field(4, b"\x00" * 4)  # DT_RESOURCE
    with pytest.raises(MltraceTypeError, match="DataType 20"):
        decode_tensor(data)


# -- TensorBoard's compiled protos as the oracle for our TensorProto and Event bytes -----------


@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 2)], ids=str)
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_tensorboard_parses_our_tensor_proto(dtype, shape):
    array = sample(dtype, shape)
    encoded = encode_tensor("layer.w", array)
    proto = tensor_pb2.TensorProto.FromString(encoded)
    assert proto.dtype == TB_DTYPE[dtype]
    assert [d.size for d in proto.tensor_shape.dim] == list(shape)
    assert [d.name for d in proto.tensor_shape.dim] == [f"layer.w_{n}" for n in shape]
    assert proto.tensor_content == array.astype(array.dtype.newbyteorder("<")).tobytes()
    # Field order and defaults as protobuf writes them: re-serializing gives our bytes back.
    assert proto.SerializeToString() == encoded


def test_tensorboard_parses_our_tensor_event():
    array = sample("float32", (2, 3))
    payload = encode_tensor_event("Net_fc1.weight", array, 9, ModeKeys.TRAIN, 7, 1234.5)
    event = event_pb2.Event.FromString(payload)  # plugin_data is singular there: parsing must work
    assert event.step == 9
    assert event.wall_time == 1234.5
    assert len(event.summary.value) == 1
    value = event.summary.value[0]
    assert value.tag == "Net_fc1.weight"
    assert value.tensor.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in value.tensor.tensor_shape.dim] == [2, 3]
    assert value.tensor.tensor_content == array.tobytes()


def test_tensor_event_round_trip_with_modes():
    array = np.array([[1, -2], [3, 4]], dtype=np.int64)
    payload = encode_tensor_event("g", array, 11, ModeKeys.EVAL, 3, 99.25)
    event = decode_event(payload)
    assert (event.step, event.wall_time) == (11, 99.25)
    [value] = event.values
    assert value.tag == "g"
    assert_same_array(value.tensor, array)
    assert value.plugin_data == {"mode_step": b"3", "mode": b"2"}
    assert value.mode is ModeKeys.EVAL
    assert event.mode_step(value) == 3


def test_tensor_event_defaults_are_left_out():
    payload = encode_tensor_event("x", np.array([1.0]), 0, ModeKeys.TRAIN, 0, 0.0)
    assert payload[0] == 0x2A  # starts with Event.summary: no wall_time, no step
    event = decode_event(payload)
    assert (event.step, event.wall_time) == (0, 0.0)
    assert event.values[0].plugin_data == {"mode_step": b"0", "mode": b"1"}


def test_plugin_data_order_is_mode_step_then_mode():
    payload = encode_tensor_event("x", np.array([1.0]), 5, ModeKeys.PREDICT, 4, 1.0)
    assert payload.index(b"mode_step") < payload.index(b"\x0a\x04mode\x12")


def test_scalar_event_matches_tensorboard():
    payload = encode_scalar_event("loss", 0.125, 3, 5.0)
    event = event_pb2.Event.FromString(payload)
    assert (event.step, event.wall_time) == (3, 5.0)
    assert event.summary.value[0].tag == "loss"
    assert event.summary.value[0].simple_value == 0.125
    assert event.SerializeToString() == payload
    decoded = decode_event(payload)
    assert decoded.values[0].simple_value == 0.125
    assert decoded.values[0].tensor is None


def test_decode_event_reads_tensorboard_scalar():
    event = event_pb2.Event(wall_time=1.5, step=3)
    event.summary.value.add(tag="loss", simple_value=0.25)
    decoded = decode_event(event.SerializeToString())
    assert (decoded.wall_time, decoded.step) == (1.5, 3)
    [value] = decoded.values
    assert value.tag == "loss"
    assert value.simple_value == 0.25
    assert value.mode is ModeKeys.GLOBAL  # no plugin data: smdebug's reader default
    assert decoded.mode_step(value) == 3


def test_decode_event_reads_tensorboard_histogram():
    event = event_pb2.Event(step=4, wall_time=2.0)
    histo = event.summary.value.add(tag="layer/w").histo
    histo.min, histo.max, histo.num, histo.sum, histo.sum_squares = -1.0, 2.0, 3.0, 1.0, 5.0
    histo.bucket_limit.extend([0.0, 1.0, 2.0])
    histo.bucket.extend([1.0, 0.0, 2.0])
    [value] = decode_event(event.SerializeToString()).values
    assert value.tag == "layer/w"
    assert value.histogram == {
        "min": -1.0,
        "max": 2.0,
        "num": 3.0,
        "sum": 1.0,
        "sum_squares": 5.0,
        "bucket_limit": [0.0, 1.0, 2.0],
        "bucket": [1.0, 0.0, 2.0],
    }


def test_decode_event_reads_float_val_tensor():
    event = event_pb2.Event(step=5)
    proto = event.summary.value.add(tag="f").tensor
    proto.dtype = types_pb2.DT_FLOAT
    proto.tensor_shape.dim.add(size=3)
    proto.float_val.extend([1.5, 2.5, -3.0])
    got = decode_event(event.SerializeToString()).values[0].tensor
    assert_same_array(got, np.array([1.5, 2.5, -3.0], dtype=np.float32))


def test_decode_event_reads_int_val_tensor_with_negatives():
    event = event_pb2.Event(step=-5)
    proto = event.summary.value.add(tag="i").tensor
    proto.dtype = types_pb2.DT_INT32
    proto.tensor_shape.dim.add(size=2)
    proto.tensor_shape.dim.add(size=2)
    proto.int_val.extend([1, -2, 3, -(2**31)])
    decoded = decode_event(event.SerializeToString())
    assert decoded.step == -5
    assert_same_array(decoded.values[0].tensor, np.array([[1, -2], [3, -(2**31)]], dtype=np.int32))


def test_decode_event_reads_int64_and_bool_val_tensors():
    event = event_pb2.Event(step=1)
    big = event.summary.value.add(tag="n").tensor
    big.dtype = types_pb2.DT_INT64
    big.tensor_shape.dim.add(size=2)
    big.int64_val.extend([2**40, -7])
    flags = event.summary.value.add(tag="b").tensor
    flags.dtype = types_pb2.DT_BOOL
    flags.tensor_shape.dim.add(size=3)
    flags.bool_val.extend([True, False, True])
    got = {v.tag: v.tensor for v in decode_event(event.SerializeToString()).values}
    assert_same_array(got["n"], np.array([2**40, -7], dtype=np.int64))
    assert_same_array(got["b"], np.array([True, False, True]))


def test_decode_event_fills_a_single_float_val():
    # TensorFlow writes one value to mean "every element has this value".
    event = event_pb2.Event(step=1)
    proto = event.summary.value.add(tag="f").tensor
    proto.dtype = types_pb2.DT_FLOAT
    proto.tensor_shape.dim.add(size=2)
    proto.tensor_shape.dim.add(size=2)
    proto.float_val.append(7.0)
    got = decode_event(event.SerializeToString()).values[0].tensor
    assert_same_array(got, np.full((2, 2), 7.0, dtype=np.float32))


def test_decode_event_reads_double_val_tensor():
    event = event_pb2.Event(step=1)
    proto = event.summary.value.add(tag="d").tensor
    proto.dtype = types_pb2.DT_DOUBLE
    proto.tensor_shape.dim.add(size=2)
    proto.double_val.extend([0.1, -2.5])
    got = decode_event(event.SerializeToString()).values[0].tensor
    assert_same_array(got, np.array([0.1, -2.5], dtype=np.float64))


def test_decode_event_reads_tensor_content_from_tensorboard():
    array = np.arange(6, dtype=np.float64).reshape(3, 2)
    event = event_pb2.Event(step=2, wall_time=3.0)
    value = event.summary.value.add(tag="t")
    value.tensor.dtype = types_pb2.DT_DOUBLE
    for n in array.shape:
        value.tensor.tensor_shape.dim.add(size=n)
    value.tensor.tensor_content = array.tobytes()
    plugin = value.metadata.plugin_data
    plugin.plugin_name, plugin.content = "mode", b"1"
    [decoded] = decode_event(event.SerializeToString()).values
    assert_same_array(decoded.tensor, array)
    assert decoded.mode is ModeKeys.TRAIN


def test_decode_event_reads_file_version_record():
    decoded = decode_event(
        event_pb2.Event(wall_time=2.0, file_version="brain.Event:2").SerializeToString()
    )
    assert decoded.file_version == "brain.Event:2"
    assert decoded.values == []


def test_decode_event_rejects_garbage():
    with pytest.raises(_wire.WireError):
        decode_event(b"\x2a\x10only-four")
