"""A step's one-number records (the reductions) encoded as one block, patched from a template.

Five reductions of every weight, bias and gradient of a transformer are hundreds of records a
step, each a 0-d float64 (int64 for the counts) under a name that is the same every step. Their
bytes are the same every step too, but for the Event's own fields (wall time, step), the value
and the metadata (mode, mode step). So the block of all of them is built once per list of names
(and lengths of those fields) as a template with holes, and each step fills the holes with
three numpy scatters and takes one CRC32C per record: a few hundred microseconds for what took
milliseconds record by record. The bytes are those of :class:`EventBatchEncoder` for the same
records (tests/format/test_scalar_block.py holds them to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mltrace.format import events
from mltrace.format.crc32c import crc32c_bytes
from mltrace.format.event_batch import EncodedRecords, EventBatchEncoder
from mltrace.modes import ModeKeys

#: Templates kept per encoder (a job's steps have one list of reductions, or one per mode).
MAX_TEMPLATES = 16


@dataclass
class _Template:
    """The block of one list of records with its holes: where the Event fields, the values
    and the metadata go, and each record's payload span (for its CRC) and framed length."""

    block: np.ndarray  # uint8, the holes zero
    fields_at: np.ndarray  # flat byte positions, record after record
    values_at: np.ndarray
    metadata_at: np.ndarray
    spans: list[tuple[int, int]]
    lengths: list[int]
    integer_rows: np.ndarray | None  # the records whose value is an int64, if any


class ScalarBlockEncoder:
    """Encodes lists of one-number records as blocks; one per writer, beside its
    :class:`EventBatchEncoder` (which builds the templates' bytes)."""

    def __init__(self) -> None:
        self._templates: dict[tuple[tuple[str, ...], tuple[bool, ...], int, int], _Template] = {}

    def encode(self, names: Sequence[str], integer: Sequence[bool], values: np.ndarray, step: int,
               mode: ModeKeys, mode_step: int, wall_time: float, out: EncodedRecords) -> None:
        """Append the records ``names[i]`` = ``values[i]`` (float64 values; an int64 0-d
        tensor where ``integer[i]``) of ``step`` to ``out``, as one part."""
        fields = events.event_fields(wall_time, step)
        metadata = events.metadata_field(mode, mode_step)
        key = (tuple(names), tuple(integer), len(fields), len(metadata))
        template = self._templates.get(key)
        if template is None:
            if len(self._templates) >= MAX_TEMPLATES:
                self._templates.clear()
            template = self._templates[key] = _build(names, integer, step, mode, mode_step, wall_time)
        n = len(names)
        block = template.block.copy()
        block[template.fields_at] = np.tile(np.frombuffer(fields, np.uint8), n)
        block[template.metadata_at] = np.tile(np.frombuffer(metadata, np.uint8), n)
        numbers = np.ascontiguousarray(values, dtype="<f8")
        rows = template.integer_rows
        if rows is not None:
            numbers = numbers.copy()
            numbers.view("<i8")[rows] = numbers[rows].astype("<i8")
        block[template.values_at] = numbers.view(np.uint8)
        data = block.tobytes()
        out.parts.append(data)
        out.names += names
        out.lengths += template.lengths
        out.crcs += [crc32c_bytes(data[a:b]) for a, b in template.spans]


def _build(names: Sequence[str], integer: Sequence[bool], step: int, mode: ModeKeys, mode_step: int,
           wall_time: float) -> _Template:
    """The template of ``names``: each record encoded by EventBatchEncoder with its value, the
    Event fields and the metadata of this step, and the positions of those three found from the
    record's layout (fields first in the payload, metadata last, the value just before it)."""
    fields_len = len(events.event_fields(wall_time, step))
    meta_len = len(events.metadata_field(mode, mode_step))
    encoder = EventBatchEncoder()
    records = [(name, np.asarray(np.int64(0) if is_int else np.float64(0.0)))
               for name, is_int in zip(names, integer)]
    encoded = encoder.encode(records, step, mode, mode_step, wall_time)
    block = np.frombuffer(b"".join(encoded.parts), dtype=np.uint8).copy()
    fields_at, values_at, metadata_at, spans = [], [], [], []
    offset = 0
    for length in encoded.lengths:
        payload_start, payload_end = offset + 12, offset + length - 4  # header 12, footer 4 bytes
        fields_at.append(np.arange(payload_start, payload_start + fields_len))
        metadata_at.append(np.arange(payload_end - meta_len, payload_end))
        values_at.append(np.arange(payload_end - meta_len - 8, payload_end - meta_len))
        spans.append((payload_start, payload_end))
        offset += length
    empty = np.zeros(0, dtype=np.intp)
    template = _Template(block, np.concatenate(fields_at) if fields_len else empty,
                         np.concatenate(values_at), np.concatenate(metadata_at), spans,
                         list(encoded.lengths),
                         np.flatnonzero(integer) if any(integer) else None)
    template.block[template.fields_at] = 0
    template.block[template.values_at] = 0
    template.block[template.metadata_at] = 0
    return template
