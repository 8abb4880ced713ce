"""numpy arrays <-> TensorProto bytes, as smdebug 1.0.34 writes them, without its dtype bugs.

TensorProto fields written (in this order, as protobuf does)::

    1 dtype          varint DataType; left out (0) for strings, as smdebug does
    2 tensor_shape   TensorShapeProto{ 2 dim: Dim{1 size, 2 name = "<tag>_<size>"} } per axis
    4 tensor_content raw C-order little-endian bytes of a numeric or bool array
    8 string_val     one UTF-8 element per entry, flattened C-order (strings only)

smdebug writes shape [] for 0-d arrays and [1] for Python scalars (its make_numpy_array), and so
does mltrace. Reading fixes smdebug's reader: int8 stays int8, and int16, uint16/32/64, complex64
and bfloat16 decode (bfloat16 to float32 exactly, or to ml_dtypes.bfloat16 when importable).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceTypeError
from mltrace.format import _wire as w

#: What a decoder raises for bytes that are not the proto it expects (public name of
#: _wire's error, so that readers need not import the private module).
WireError = w.WireError

# TensorFlow DataType numbers (types.proto).
DT_INVALID, DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING = range(8)
DT_COMPLEX64, DT_INT64, DT_BOOL = 8, 9, 10
DT_BFLOAT16, DT_UINT16, DT_COMPLEX128, DT_HALF, DT_UINT32, DT_UINT64 = 14, 17, 18, 19, 22, 23

_NUMPY_TO_DT: dict[np.dtype[Any], int] = {
    np.dtype(np.float16): DT_HALF,
    np.dtype(np.float32): DT_FLOAT,
    np.dtype(np.float64): DT_DOUBLE,
    np.dtype(np.int8): DT_INT8,
    np.dtype(np.int16): DT_INT16,
    np.dtype(np.int32): DT_INT32,
    np.dtype(np.int64): DT_INT64,
    np.dtype(np.uint8): DT_UINT8,
    np.dtype(np.uint16): DT_UINT16,
    np.dtype(np.uint32): DT_UINT32,
    np.dtype(np.uint64): DT_UINT64,
    np.dtype(np.complex64): DT_COMPLEX64,
    np.dtype(np.complex128): DT_COMPLEX128,
    np.dtype(np.bool_): DT_BOOL,
}
_DT_TO_NUMPY = {dt: npdt for npdt, dt in _NUMPY_TO_DT.items()}
SUPPORTED_DTYPES = sorted(str(d) for d in _NUMPY_TO_DT) + ["bfloat16", "str", "bytes"]


class BFloat16Bits(np.ndarray):
    """uint16 bit patterns of bfloat16 values, for writers without ml_dtypes.

    ``bits.view(BFloat16Bits)`` marks an array so that it is stored as DT_BFLOAT16.
    """

    def to_float32(self) -> np.ndarray:
        """The exact float32 values (bfloat16 is the upper half of a float32)."""
        return (np.asarray(self, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bfloat16_dtype() -> np.dtype | None:
    """Return ml_dtypes' bfloat16 dtype when that package is importable, else None."""
    try:
        import ml_dtypes  # noqa: PLC0415 - optional
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def dtype_code(array: np.ndarray) -> int:
    code = _NUMPY_TO_DT.get(array.dtype)
    if code is not None:
        return code
    if array.dtype.name == "bfloat16":
        return DT_BFLOAT16
    code = _NUMPY_TO_DT.get(array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype)
    if code is None:
        raise MltraceTypeError(
            f"cannot save a tensor of dtype {array.dtype}: supported are {', '.join(SUPPORTED_DTYPES)};"
            " convert it first (e.g. array.astype(np.float32))"
        )
    return code


@functools.lru_cache(maxsize=4096)
def _shape_field(tag: str, shape: tuple[int, ...]) -> bytes:
    """The encoded tensor_shape field; the same tensors recur every step, hence the cache."""
    dims = b""
    for size in shape:
        dim = (w.varint_field(1, size) if size else b"") + w.len_field(2, f"{tag}_{size}".encode())
        dims += w.len_field(2, dim)
    return w.len_field(2, dims)


def _is_text(array: np.ndarray) -> bool:
    if array.dtype.kind in "US":
        return True
    if array.dtype.kind == "O":
        flat = array.reshape(-1)
        if all(isinstance(x, (str, bytes)) for x in flat):
            return True
        kinds = sorted({type(x).__name__ for x in flat})
        raise MltraceTypeError(
            f"cannot save an object array holding {kinds}: only numeric, bool and string arrays "
            "are saved; convert it to one of those first"
        )
    return False


def encode_tensor(tag: str, array: np.ndarray) -> bytes:
    """Serialize ``array`` as a TensorProto, byte-for-byte as smdebug 1.0.34 would.

    Args:
        tag: the tensor name; smdebug repeats it in every Dim name.
        array: the value; numeric, bool, str/bytes (any rank), or bfloat16 (an ml_dtypes array
            or a BFloat16Bits view of the bit patterns).

    Raises:
        MltraceTypeError: object arrays of non-strings, structured, datetime or other dtypes.
    """
    return b"".join(tensor_parts(tag, array))


def tensor_parts(tag: str, array: np.ndarray) -> tuple[bytes, bytes]:
    """:func:`encode_tensor` in two parts, the proto's fields up to its ``tensor_content`` and
    the content itself: a writer puts the values in its file buffer without building each
    enclosing message around them (one copy of the values instead of one per message)."""
    if array.dtype.kind in "mMV" and array.dtype.name != "bfloat16":
        raise MltraceTypeError(
            f"cannot save tensor {tag!r} of dtype {array.dtype}: datetime, timedelta and structured "
            "arrays are not tensors; convert to a numeric dtype first"
        )
    if _is_text(array):
        flat = array.reshape(-1)
        # Text as smdebug writes it (DataType left unset); bytes as DT_STRING, so that they read
        # back as bytes (smdebug's reader cannot read bytes arrays at all).
        is_bytes = array.dtype.kind == "S" or (flat.size and all(isinstance(x, bytes) for x in flat))
        shape = _shape_field(tag, array.shape)
        body = w.varint_field(1, DT_STRING) + shape if is_bytes else shape
        for item in flat:
            body += w.len_field(8, item if isinstance(item, bytes) else str(item).encode("utf-8"))
        return body, b""
    code = DT_BFLOAT16 if isinstance(array, BFloat16Bits) else dtype_code(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    content = np.ascontiguousarray(array).tobytes() if array.nbytes else b""
    return numeric_tensor_head(tag, code, array.shape, len(content)), content


@functools.lru_cache(maxsize=8192)
def numeric_tensor_head(tag: str, code: int, shape: tuple[int, ...], content_length: int) -> bytes:
    """A numeric TensorProto's fields before its ``tensor_content`` bytes (dtype, shape, the
    content's key and length; no content field when it is empty). The same tensors recur every
    step with the same shape, so the bytes are built once per tensor, not per record."""
    head = w.varint_field(1, code) + _shape_field(tag, shape)
    if not content_length:
        return head
    return head + w.key(4, w.LEN) + w.varint(content_length)


#: Most elements a TensorProto may expand one *_val value to (TensorFlow's "fill"): a damaged
#: shape must not make the reader allocate gigabytes. 2**26 elements is 512 MB of float64.
MAX_FILL_ELEMENTS = 1 << 26
#: numpy's limit on dimensions is 64; TensorFlow's own is 254. Deeper shapes are damage here.
MAX_RANK = 32


def decode_tensor(data: bytes | memoryview) -> np.ndarray:
    """Parse TensorProto bytes back into a numpy array.

    Raises:
        MltraceTypeError: a DataType this reader does not know.
        WireError: bytes that are not a TensorProto, or whose shape does not
            fit their values (a damaged record).
    """
    try:
        return _decode_tensor(data)
    except (w.WireError, MltraceTypeError):
        raise
    except (ValueError, OverflowError, IndexError) as exc:  # numpy refusing damaged values
        raise w.WireError(f"TensorProto does not decode ({type(exc).__name__}: {exc})") from None


def _elements(shape: list[int]) -> int:
    """Element count of ``shape`` (1 for a 0-d tensor), in Python ints so nothing overflows."""
    count = 1
    for size in shape:
        count *= size
    return count


def _decode_tensor(data: bytes | memoryview) -> np.ndarray:
    code = 0
    shape: list[int] = []
    content: bytes | None = None
    strings: list[bytes] = []
    typed_vals: dict[int, list[Any]] = {}
    for field, wt, value in w.fields(data):
        if field == 1 and wt == w.VARINT:
            code = int(value)
        elif field == 2 and wt == w.LEN:
            for dfield, dwt, dim in w.fields(value):  # type: ignore[arg-type]
                if dfield == 2 and dwt == w.LEN:
                    size = 0
                    for sfield, swt, sval in w.fields(dim):  # type: ignore[arg-type]
                        if sfield == 1 and swt == w.VARINT:
                            size = w.signed64(int(sval))
                    if size < 0 or len(shape) >= MAX_RANK:
                        raise w.WireError(f"tensor shape {shape + [size]} is not a shape")
                    shape.append(size)
        elif field == 4 and wt == w.LEN:
            content = bytes(value)
        elif field == 8 and wt == w.LEN:
            strings.append(bytes(value))
        elif field in (5, 6, 7, 10, 11):  # float, double, int, int64, bool *_val (packed or not)
            typed_vals.setdefault(field, []).append((wt, value))
    if code in (DT_INVALID, DT_STRING) and (strings or content is None):
        try:
            items = [s.decode("utf-8") for s in strings] if code == DT_INVALID else strings
        except UnicodeDecodeError as exc:
            raise w.WireError(f"a string element is not UTF-8 ({exc})") from None
        if shape and _elements(shape) != len(items):
            raise w.WireError(f"tensor of shape {shape} holds {len(items)} strings")
        out = np.array(items) if items else np.array([], dtype=bytes if code == DT_STRING else str)
        return out.reshape(shape) if shape or out.size == 1 else out
    if code == DT_BFLOAT16:
        bits = np.frombuffer(_checked_content(content or b"", 2, shape), dtype="<u2").reshape(shape)
        bf16 = bfloat16_dtype()
        if bf16 is not None:
            return bits.view(bf16).copy()
        return bits.view(BFloat16Bits).to_float32()
    npdtype = _DT_TO_NUMPY.get(code)
    if npdtype is None:
        raise MltraceTypeError(
            f"tensor has DataType {code}, which mltrace cannot decode (known: "
            f"{sorted(_DT_TO_NUMPY.values())} and bfloat16); the file may come from a newer writer: "
            "upgrade mltrace to read it"
        )
    if content is not None:
        content = _checked_content(content, npdtype.itemsize, shape)
        return np.frombuffer(content, dtype=npdtype.newbyteorder("<")).astype(npdtype).reshape(shape)
    return _decode_typed_vals(typed_vals, npdtype, shape)


def _checked_content(content: bytes, itemsize: int, shape: list[int]) -> bytes:
    """``content`` if it holds exactly the elements ``shape`` asks for, else WireError."""
    if len(content) != _elements(shape) * itemsize:
        raise w.WireError(
            f"tensor_content holds {len(content)} bytes, but shape {shape} of {itemsize}-byte "
            "elements needs a different count"
        )
    return content


def _decode_typed_vals(vals: dict[int, list[Any]], npdtype: np.dtype, shape: list[int]) -> np.ndarray:
    """Decode the *_val fields some writers (TensorFlow's own) use instead of tensor_content."""
    items: list[Any] = []
    for field, entries in vals.items():
        for wt, value in entries:
            if wt == w.LEN:  # packed
                if field in (5, 6):
                    items.extend(np.frombuffer(bytes(value), dtype="<f4" if field == 5 else "<f8").tolist())
                else:
                    pos, raw = 0, memoryview(value)
                    while pos < len(raw):
                        v, pos = w.read_varint(raw, pos)
                        items.append(w.signed64(v))
            elif wt == w.FIXED32:
                items.append(w.as_float(value))
            elif wt == w.FIXED64:
                items.append(w.as_double(value))
            else:
                items.append(w.signed64(int(value)))
    out = np.array(items, dtype=npdtype)
    count = _elements(shape)
    if out.size == 1 and count > MAX_FILL_ELEMENTS:
        raise w.WireError(f"tensor of shape {shape} would fill {count} elements from one value")
    if out.size == 1 and count > 1:  # TensorFlow writes one value to mean "fill"
        out = np.full(count, out[0], dtype=npdtype)
    if out.size != count:
        raise MltraceTypeError(
            f"tensor of shape {shape} carries {out.size} values in its *_val fields; it cannot be "
            "decoded (the record is damaged or was written by an unknown writer)"
        )
    return out.reshape(shape)
