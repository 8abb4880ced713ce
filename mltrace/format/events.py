"""Event protos (the subset smdebug and TensorBoard write), encoded and decoded by hand.

An events/ record holds one Event with one tensor::

    Event { 1 wall_time: double, 2 step: int64 (global step), 5 summary: Summary }
    Summary { 1 value: Value }
    Value { 1 tag: string (tensor name), 8 tensor: TensorProto,
            9 metadata: SummaryMetadata { 1 plugin_data: PluginData{1 plugin_name, 2 content} } }

smdebug's metadata carries two plugin_data entries, ``mode_step`` then ``mode``, whose contents
are decimal strings (the mode as ModeKeys value, "1" for TRAIN). Defaults (step 0, wall_time 0)
are left out, as protobuf does, so encoded bytes equal protobuf's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from mltrace.format import _wire as w
from mltrace.format.tensors import decode_tensor, tensor_parts
from mltrace.modes import MODE_PLUGIN_NAME, MODE_STEP_PLUGIN_NAME, ModeKeys

#: What a decoder raises for bytes that are not the proto it expects (public name of
#: _wire's error, so that readers need not import the private module).
WireError = w.WireError


def _plugin_data(name: str, content: str) -> bytes:
    return w.len_field(1, w.len_field(1, name.encode()) + w.len_field(2, content.encode()))


def metadata_field(mode: ModeKeys, mode_step: int) -> bytes:
    """Value.metadata: smdebug's two plugin_data entries, mode_step then mode. The mode step
    changes every step, so only its decimal digits are encoded per call; the rest is cached."""
    digits = b"%d" % mode_step
    step_data = w.len_field(1, _MODE_STEP_NAME_FIELD + w.len_field(2, digits))
    inner = step_data + _mode_plugin_data(mode)
    return _METADATA_KEY + w.varint(len(inner)) + inner


@functools.lru_cache(maxsize=8)
def _mode_plugin_data(mode: ModeKeys) -> bytes:
    return _plugin_data(MODE_PLUGIN_NAME, str(mode.value))


_MODE_STEP_NAME_FIELD = w.len_field(1, MODE_STEP_PLUGIN_NAME.encode())
_METADATA_KEY = w.key(9, w.LEN)


@functools.lru_cache(maxsize=4096)
def _tag_field(tag: str) -> bytes:
    return w.len_field(1, tag.encode("utf-8"))


def _event(wall_time: float, step: int, summary: bytes) -> bytes:
    return event_fields(wall_time, step) + w.len_field(5, summary)


def event_fields(wall_time: float, step: int) -> bytes:
    """An Event's fields before its summary: wall_time and step, each left out when zero."""
    head = w.double_field(1, wall_time) if wall_time else b""
    return head + w.varint_field(2, step) if step else head


def heads_before_value(wall_time: float, step: int, value_length: int) -> bytes:
    """An Event's bytes before the one Summary.Value of ``value_length`` bytes it holds: its
    own fields, then :func:`summary_head`."""
    return event_fields(wall_time, step) + summary_head(value_length)


def summary_head(value_length: int) -> bytes:
    """The bytes between an Event's own fields and its one Summary.Value of ``value_length``
    bytes: the summary's key and length, the value's key and length (lengths computed, so the
    value is not copied into each enclosing message). The same every step for a tensor."""
    value_key_and_length = _SUMMARY_VALUE_KEY + w.varint(value_length)
    return (_EVENT_SUMMARY_KEY + w.varint(len(value_key_and_length) + value_length)
            + value_key_and_length)


def encode_tensor_event(
    tag: str,
    array: np.ndarray,
    step: int,
    mode: ModeKeys,
    mode_step: int,
    wall_time: float,
) -> bytes:
    """Serialize one smdebug tensor Event (the payload of one events/ record)."""
    return b"".join(tensor_event_parts(tag, array, step, mode, mode_step, wall_time))


def tensor_event_parts(
    tag: str, array: np.ndarray, step: int, mode: ModeKeys, mode_step: int, wall_time: float,
) -> tuple[bytes, bytes, bytes]:
    """:func:`encode_tensor_event` as (fields before the tensor's values, the values, fields
    after them): each enclosing message's length is computed, not found by building it, so
    the values are not copied once per message (see mltrace.format.tensors.tensor_parts)."""
    tensor_head, content = tensor_parts(tag, array)
    metadata = metadata_field(mode, mode_step)
    head = value_head(tag, tensor_head, len(content))
    value_len = len(head) + len(content) + len(metadata)
    return heads_before_value(wall_time, step, value_len) + head, content, metadata


@functools.lru_cache(maxsize=8192)
def value_head(tag: str, tensor_head: bytes, content_length: int) -> bytes:
    """Value's fields before the tensor's values: its tag, the tensor's key and length, and the
    tensor's own fields before its content. A tensor's are the same every step (same name,
    dtype and shape), so they are built once; only the step, time and mode step change."""
    return (_tag_field(tag) + w.key(8, w.LEN) + w.varint(len(tensor_head) + content_length)
            + tensor_head)


_SUMMARY_VALUE_KEY = w.key(1, w.LEN)
_EVENT_SUMMARY_KEY = w.key(5, w.LEN)


def encode_scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """Serialize a TensorBoard scalar Event (``Value { 1 tag, 2 simple_value: float }``, a float32
    with no metadata): what torch's ``SummaryWriter.add_scalar`` writes by default; TensorBoard's
    readers give it the "scalars" plugin and DATA_CLASS_SCALAR."""
    val = w.len_field(1, tag.encode("utf-8")) + w.float_field(2, float(value))
    return _event(wall_time, step, w.len_field(1, val))


#: The first record of every TensorBoard events file (readers parse the number after the colon;
#: 2 or more turns on restart detection by SessionLog.START instead of purging on step order).
FILE_VERSION = "brain.Event:2"


def encode_file_version_event(wall_time: float, writer: str = "mltrace") -> bytes:
    """Serialize a TensorBoard file's first Event, as TensorBoard's own EventFileWriter does::

        Event { 1 wall_time: double, 3 file_version: "brain.Event:2",
                10 source_metadata: SourceMetadata { 1 writer: string } }
    """
    head = w.double_field(1, wall_time) if wall_time else b""
    return head + w.len_field(3, FILE_VERSION.encode()) + w.len_field(10, w.len_field(1, writer.encode()))


def _nonzero_double(field_number: int, value: float) -> bytes:
    # proto3 leaves out a double whose bits are all zero (0.0, not -0.0), as protobuf does.
    value = float(value)
    return w.double_field(field_number, value) if (value != 0.0 or math.copysign(1.0, value) < 0) else b""


def histogram_parts(
    min: float, max: float, num: float, sum: float, sum_squares: float,
    bucket_limit: np.ndarray, bucket: np.ndarray,
) -> list[bytes]:
    """Serialize a HistogramProto (TensorBoard's legacy histogram, what torch's SummaryWriter
    writes) as parts whose join is the proto::

        HistogramProto { 1 min, 2 max, 3 num, 4 sum, 5 sum_squares: double,
                         6 bucket_limit: packed double, 7 bucket: packed double }

    ``bucket_limit[i]`` is the right edge of bucket ``i`` (the first bucket starts at -DBL_MAX);
    ``bucket`` holds the counts, as doubles. In parts, the two packed arrays (a few kB each) are
    not copied into a joined proto before they are framed.
    """
    head = b"".join(_nonzero_double(f, v) for f, v in ((1, min), (2, max), (3, num), (4, sum), (5, sum_squares)))
    parts = [head]
    for field_number, values in ((6, bucket_limit), (7, bucket)):
        packed = np.ascontiguousarray(values, dtype="<f8").tobytes()
        if packed:
            parts += [w.key(field_number, w.LEN) + w.varint(len(packed)), packed]
    return parts


def encode_histogram_event(tag: str, histogram: bytes, step: int, wall_time: float) -> bytes:
    """Serialize a TensorBoard histogram Event: ``Value { 1 tag, 5 histo: HistogramProto }`` with
    no metadata, byte for byte what torch's ``SummaryWriter.add_histogram`` writes (TensorBoard's
    readers give such values the "histograms" plugin and its data class)."""
    return b"".join(histogram_event_parts(tag, [histogram], step, wall_time))


def histogram_event_parts(tag: str, histogram: list[bytes], step: int, wall_time: float) -> list[bytes]:
    """:func:`encode_histogram_event` of a HistogramProto given in parts (:func:`histogram_parts`),
    in parts: each enclosing message's length is computed, so the proto is not copied once per
    message around it."""
    histogram_length = sum(len(p) for p in histogram)
    head = _tag_field(tag) + w.key(5, w.LEN) + w.varint(histogram_length)
    value_length = len(head) + histogram_length
    return [heads_before_value(wall_time, step, value_length) + head, *histogram]


@dataclass
class DecodedValue:
    """One Summary.Value of a decoded Event: a tensor (events/), a scalar or a histogram (TB)."""

    tag: str
    tensor: np.ndarray | None = None
    simple_value: float | None = None
    histogram: dict[str, object] | None = None
    plugin_data: dict[str, bytes] = field(default_factory=dict)

    @property
    def mode(self) -> ModeKeys:
        """The mode from smdebug's plugin data; GLOBAL when absent, as smdebug's reader does."""
        raw = self.plugin_data.get(MODE_PLUGIN_NAME)
        try:
            return ModeKeys(int(raw)) if raw else ModeKeys.GLOBAL
        except ValueError:
            raise w.WireError(f"the record's mode {raw!r} is not a mode (damaged)") from None


@dataclass
class DecodedEvent:
    """A decoded Event: wall time, global step, and its summary values."""

    wall_time: float = 0.0
    step: int = 0
    values: list[DecodedValue] = field(default_factory=list)
    file_version: str | None = None

    def mode_step(self, value: DecodedValue) -> int:
        """The mode step of ``value``; the global step when the plugin data has none."""
        raw = value.plugin_data.get(MODE_STEP_PLUGIN_NAME)
        try:
            return int(raw) if raw else self.step
        except ValueError:
            raise w.WireError(f"the record's mode step {raw!r} is not a number (damaged)") from None


def _text(raw: memoryview) -> str:
    """A protobuf string field; WireError (not UnicodeDecodeError) when it is not UTF-8."""
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise w.WireError(f"a string field is not UTF-8 ({exc})") from None


def _decode_histogram(data: memoryview) -> dict[str, object]:
    out: dict[str, object] = {"bucket_limit": [], "bucket": []}
    names = {1: "min", 2: "max", 3: "num", 4: "sum", 5: "sum_squares"}
    for f, wt, v in w.fields(data):
        if f in names and wt == w.FIXED64:
            out[names[f]] = w.as_double(v)  # type: ignore[arg-type]
        elif f in (6, 7) and wt == w.LEN:
            key = "bucket_limit" if f == 6 else "bucket"
            if len(v) % 8:  # type: ignore[arg-type]
                raise w.WireError(f"histogram {key} is not whole doubles")
            out[key] = np.frombuffer(bytes(v), dtype="<f8").tolist()
    return out


def _decode_value(data: memoryview) -> DecodedValue:
    value = DecodedValue(tag="")
    for f, wt, v in w.fields(data):
        if f == 1 and wt == w.LEN:
            value.tag = _text(v)  # type: ignore[arg-type]
        elif f == 2 and wt == w.FIXED32:
            value.simple_value = w.as_float(v)  # type: ignore[arg-type]
        elif f == 5 and wt == w.LEN:
            value.histogram = _decode_histogram(v)  # type: ignore[arg-type]
        elif f == 8 and wt == w.LEN:
            value.tensor = decode_tensor(v)  # type: ignore[arg-type]
        elif f == 9 and wt == w.LEN:
            for pf, pwt, pd in w.fields(v):  # type: ignore[arg-type]
                if pf == 1 and pwt == w.LEN:
                    name, content = "", b""
                    for ff, _, fv in w.fields(pd):  # type: ignore[arg-type]
                        if ff == 1:
                            name = _text(fv)  # type: ignore[arg-type]
                        elif ff == 2:
                            content = bytes(fv)
                    value.plugin_data[name] = content
    return value


def decode_event(payload: bytes | memoryview) -> DecodedEvent:
    """Parse an Event payload (one record's bytes without framing).

    Raises:
        WireError: bytes that are not an Event.
        mltrace.exceptions.MltraceTypeError: a tensor of a DataType this reader does not know.
    """
    event = DecodedEvent()
    for f, wt, v in w.fields(payload):
        if f == 1 and wt == w.FIXED64:
            event.wall_time = w.as_double(v)  # type: ignore[arg-type]
        elif f == 2 and wt == w.VARINT:
            event.step = w.signed64(int(v))
        elif f == 3 and wt == w.LEN:
            event.file_version = _text(v)  # type: ignore[arg-type]
        elif f == 5 and wt == w.LEN:
            for sf, swt, sv in w.fields(v):  # type: ignore[arg-type]
                if sf == 1 and swt == w.LEN:
                    event.values.append(_decode_value(sv))  # type: ignore[arg-type]
    return event


def _skip(buf: bytes, pos: int, wire_type: int) -> int:
    """Position after the value of a field of ``wire_type`` starting at ``pos``."""
    if wire_type == w.VARINT:
        return w.read_varint(buf, pos)[1]  # bounds-checked: a damaged record ends anywhere
    if wire_type == w.FIXED64:
        return pos + 8
    if wire_type == w.FIXED32:
        return pos + 4
    if wire_type == w.LEN:
        length, pos = w.read_varint(buf, pos)
        return pos + length
    raise w.WireError(f"unsupported wire type {wire_type}")


def find_field(buf: bytes, start: int, end: int, field: int) -> tuple[int, int] | None:
    """(start, end) of the first length-delimited ``field`` in buf[start:end], else None.

    Raises:
        WireError: the fields before it, or its length, run past ``end``."""
    pos = start
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = w.read_varint(buf, pos)
        if tag == (field << 3) | w.LEN:
            if pos >= end:
                raise w.WireError(f"field {field} is cut off at the end of its message")
            length = buf[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = w.read_varint(buf, pos)
            if pos + length > end:
                raise w.WireError(f"field {field} runs past the end of its message")
            return pos, pos + length
        pos = _skip(buf, pos, tag & 7)
    return None


def decode_tensor_payload(payload: bytes, tag: str | None = None) -> np.ndarray | None:
    """The tensor of an events/ record, read straight from Event.summary.value[0].tensor.

    The reader's hot path (one call per value()): it skips wall time, step and plugin data, and
    returns None when the record holds no tensor. decode_event is the general decoder.

    Args:
        payload: the record's Event bytes.
        tag: the tensor name the index gives this record; when set, a record of another tensor
            is refused (an index entry pointing at the wrong record, whose own CRC matches).

    Raises:
        WireError: not an Event, or a record of another tensor than ``tag``.
        mltrace.exceptions.MltraceTypeError: a DataType this reader does not know.
    """
    buf = bytes(payload)
    summary = find_field(buf, 0, len(buf), 5)
    if summary is None:
        return None
    value = find_field(buf, summary[0], summary[1], 1)
    if value is None:
        return None
    if tag is not None:
        found = find_field(buf, value[0], value[1], 1)
        held = buf[found[0]:found[1]] if found else b""
        if held != tag.encode("utf-8", "surrogatepass"):
            raise w.WireError(f"the record holds tensor {held.decode('utf-8', 'replace')!r}, not "
                              f"{tag!r}: the index points at the wrong record")
    tensor = find_field(buf, value[0], value[1], 8)
    if tensor is None:
        return None
    return decode_tensor(memoryview(buf)[tensor[0]:tensor[1]])
