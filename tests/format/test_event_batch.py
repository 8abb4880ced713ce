"""The batch encoder (mltrace.format.event_batch) writes the bytes the record-by-record encoder
wrote: byte for byte the same files for the same calls, over every dtype the format holds and
every reduction, and records equal to ``tensor_event_parts``' framed, whatever the step.

tests/format/golden/ holds the files the writer wrote before the batch encoder existed (commit
67ab3d4, ``python -m tests.support.golden_trials DIR`` with a fixed clock); real smdebug reading
such a trial is tests/legacy/test_smdebug_reads_batch_records.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mltrace.format.crc32c import crc32c
from mltrace.format.event_batch import JOIN_LIMIT, EventBatchEncoder
from mltrace.format.events import decode_event, tensor_event_parts
from mltrace.format.records import MAGIC_FOOTER, record_header, unframe_record
from mltrace.modes import ModeKeys
from tests.support import golden_trials

GOLDEN = Path(__file__).parent / "golden"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("which", ["writer", "hook"])
def test_the_files_are_byte_for_byte_those_of_the_record_by_record_writer(tmp_path, which):
    """Every file of the trial (events, index, collections, markers) equals the golden one."""
    write = golden_trials.write_writer_trial if which == "writer" else golden_trials.write_hook_trial
    write(str(tmp_path / which))
    written, golden = _files(tmp_path / which), _files(GOLDEN / which)
    assert sorted(written) == sorted(golden)
    different = [name for name in golden if written[name] != golden[name]]
    assert not different, f"files differ from tests/format/golden/{which}: {different}"


def _framed_one_by_one(name: str, value: np.ndarray, step: int, mode: ModeKeys, mode_step: int,
                       wall_time: float) -> tuple[bytes, int]:
    payload = b"".join(tensor_event_parts(name, value, step, mode, mode_step, wall_time))
    return record_header(len(payload)) + payload + MAGIC_FOOTER, crc32c(payload)


@pytest.mark.parametrize("step, mode_step", [(0, 0), (5, 3), (127, 127), (128, 9),
                                             (16384, 1_000_000_000), (2**40, 2**40)])
def test_each_record_is_the_framed_event_of_tensor_event_parts(step, mode_step):
    """Steps and mode steps whose encodings change length (varints of 1-6 bytes, 1-13 digits),
    and a zero step and wall time (left out of the Event, as protobuf does), over one encoder
    whose per-tensor cache was filled at another step."""
    encoder = EventBatchEncoder()
    records = golden_trials.arrays()
    encoder.encode(records, 1, ModeKeys.TRAIN, 1, 12.5)  # fills the cache at another step
    for mode, wall_time in ((ModeKeys.TRAIN, 1_700_000_000.5), (ModeKeys.PREDICT, 0.0)):
        out = encoder.encode(records, step, mode, mode_step, wall_time)
        assert out.names == [name for name, _ in records]
        joined = b"".join(out.parts)
        offset = 0
        for (name, value), length, crc in zip(records, out.lengths, out.crcs):
            expected, expected_crc = _framed_one_by_one(name, value, step, mode, mode_step, wall_time)
            assert joined[offset:offset + length] == expected, name
            assert crc == expected_crc, name
            offset += length
        assert offset == len(joined)


def test_small_values_make_one_part_and_large_ones_are_not_copied():
    """A record of a reduction is one bytes object; a large tensor's values are their own part
    (the writer hands them to the pipe as they are)."""
    encoder = EventBatchEncoder()
    small = np.float64(1.5)
    large = np.arange(JOIN_LIMIT, dtype=np.float32)  # 4 * JOIN_LIMIT bytes
    out = encoder.encode([("a", np.asarray(small)), ("b", large)], 3, ModeKeys.TRAIN, 3, 1.0)
    assert len(out.parts) == 1 + 5  # one record; header, head, values, metadata, footer
    assert out.parts[3] == large.tobytes()


def test_records_decode_to_their_names_values_steps_and_modes():
    encoder = EventBatchEncoder()
    values = np.array([0.25, -3.0, np.nan, np.inf, 1e300])
    records = [(f"layer_{i}_mean", np.asarray(v)) for i, v in enumerate(values)]
    records.append(("count", np.asarray(np.int64(7))))
    out = encoder.encode(records, 42, ModeKeys.EVAL, 6, 99.0)
    joined, offset = b"".join(out.parts), 0
    for (name, value), length in zip(records, out.lengths):
        event = decode_event(unframe_record(joined[offset:offset + length], name, "magic"))
        offset += length
        (decoded,) = event.values
        assert (decoded.tag, event.step, event.wall_time) == (name, 42, 99.0)
        assert decoded.mode == ModeKeys.EVAL and event.mode_step(decoded) == 6
        assert decoded.tensor.dtype == value.dtype and decoded.tensor.shape == ()
        np.testing.assert_array_equal(decoded.tensor, value)


def test_a_value_the_format_cannot_hold_is_refused_by_name():
    with pytest.raises(Exception, match="datetime"):
        EventBatchEncoder().encode([("when", np.array(["2020-01-01"], dtype="datetime64[D]"))],
                                   0, ModeKeys.TRAIN, 0, 1.0)
