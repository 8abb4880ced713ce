"""The on-disk format, both directions; the only package that knows bytes and file names.

Submodules: crc32c (checksums), records (TFRecord framing), _wire (protobuf primitives),
tensors (TensorProto), events (Event/Summary), index (index JSON), paths (the trial layout),
json_safe (NaN and infinities in the JSON files and answers mltrace writes).
"""

FORMAT_VERSION = "smdebug-1.0.34"
REDUCTIONS_PREFIX = "smdebug/reductions/"
#: Tensor name prefix smdebug gives save_scalar() values in events/.
SCALAR_PREFIX = "scalar/"
