"""A step's one-number records as one block (mltrace.format.scalar_block): the same bytes,
lengths and CRCs as the record-by-record batch encoder, whatever the step, mode step, wall time
and mix of float64 and int64 records, over one encoder whose templates were made at other steps;
and the trial writer's block gives the same files as its records one by one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mltrace.format.event_batch import EncodedRecords, EventBatchEncoder
from mltrace.format.scalar_block import MAX_TEMPLATES, ScalarBlockEncoder
from mltrace.modes import ModeKeys
from mltrace.storage import open_storage
from mltrace.writer.trial_writer import TrialWriter

NAMES = [f"weights/GPT_blocks.{i}.attn.weight_{red}" for i in range(4)
         for red in ("min", "max", "mean", "std", "l2", "nan_count")] + ["loss_sum", "\u00e9t\u00e9/x"]
INTEGER = [name.endswith("_count") for name in NAMES]


def _values(seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).normal(size=len(NAMES)) * 1e3
    values[[0, 1]] = [np.nan, -np.inf]
    values[np.asarray(INTEGER)] = np.arange(sum(INTEGER)) * 1_000_003  # counts: whole numbers
    return values


def _one_by_one(values: np.ndarray, step: int, mode: ModeKeys, mode_step: int, wall_time: float) -> EncodedRecords:
    records = [(name, np.asarray(np.int64(v) if is_int else np.float64(v)))
               for name, is_int, v in zip(NAMES, INTEGER, values)]
    return EventBatchEncoder().encode(records, step, mode, mode_step, wall_time)


@pytest.mark.parametrize("step, mode, mode_step, wall_time", [
    (0, ModeKeys.TRAIN, 0, 0.0), (5, ModeKeys.TRAIN, 3, 1_700_000_000.5), (127, ModeKeys.EVAL, 127, 2.0),
    (128, ModeKeys.PREDICT, 9, 3.0), (16384, ModeKeys.GLOBAL, 1_000_000_000, 4.0), (2**40, ModeKeys.TRAIN, 2**40, 5.0)])
def test_the_block_is_the_records_one_by_one(step, mode, mode_step, wall_time):
    """Steps whose varints change length, a zero step and wall time (left out of the Event),
    every mode; NaN, infinity and int64 counts among the values."""
    blocks = ScalarBlockEncoder()
    blocks.encode(NAMES, INTEGER, _values(0), 1, ModeKeys.TRAIN, 1, 12.5, EncodedRecords())  # a template at another step
    for seed in (1, 2):  # the template made at this step, then used again
        values = _values(seed)
        out = EncodedRecords()
        blocks.encode(NAMES, INTEGER, values, step, mode, mode_step, wall_time, out)
        expected = _one_by_one(values, step, mode, mode_step, wall_time)
        assert len(out.parts) == 1
        assert out.parts[0] == b"".join(expected.parts)
        assert (out.names, out.lengths, out.crcs) == (expected.names, expected.lengths, expected.crcs)


def test_templates_are_bounded():
    blocks = ScalarBlockEncoder()
    for i in range(MAX_TEMPLATES + 5):
        blocks.encode([f"t{i}"], [False], np.array([1.0]), 1, ModeKeys.TRAIN, 1, 1.0, EncodedRecords())
    assert len(blocks._templates) <= MAX_TEMPLATES


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_writer_writes_a_block_as_it_writes_its_records(tmp_path):
    """TrialWriter.add_scalars and add_tensors of the same 0-d records, beside a raw tensor, in
    two steps: the same files (one wall time per step: the first record's)."""
    for which in ("block", "records"):
        writer = TrialWriter(open_storage(str(tmp_path / which)), "worker_0", batch_steps=False)
        for step in (0, 1):
            writer.open_step(step, ModeKeys.TRAIN, step)
            writer._step.wall_time = 1_700_000_000.25  # type: ignore[union-attr]
            writer.add_tensor("raw", np.arange(100, dtype=np.float32), ModeKeys.TRAIN, step)
            values = _values(step)
            if which == "block":
                writer.add_scalars(NAMES, INTEGER, values, ModeKeys.TRAIN, step)
            else:
                writer.add_tensors([(n, np.asarray(np.int64(v) if i else np.float64(v)))
                                    for n, i, v in zip(NAMES, INTEGER, values)], ModeKeys.TRAIN, step)
            writer.close_step()
        writer.close()
    assert _files(tmp_path / "block") == _files(tmp_path / "records")


def test_a_steps_records_carry_the_wall_time_of_its_first_record(tmp_path, monkeypatch):
    """The Event prefix (wall time, step) is built once per step: every record of a step, raw
    or reduction, has the time its first record was added; the next step has its own."""
    from mltrace.format.events import decode_event
    from mltrace.format.records import iter_records
    from mltrace.writer import trial_writer

    clock = iter(range(100, 200))
    monkeypatch.setattr(trial_writer.time, "time", lambda: float(next(clock)))
    writer = TrialWriter(open_storage(str(tmp_path)), "worker_0", batch_steps=False)
    for step in (0, 1):
        writer.open_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("raw", np.arange(100, dtype=np.float32), ModeKeys.TRAIN, step)
        writer.add_tensor("loss", np.float32(step), ModeKeys.TRAIN, step)
        writer.add_scalars(NAMES, INTEGER, _values(step), ModeKeys.TRAIN, step)
        writer.close_step()
    writer.close()
    times = {}
    for path in sorted(tmp_path.rglob("*.tfevents")):
        data = path.read_bytes()
        events = [decode_event(payload) for _, payload in iter_records(data, str(path))]
        assert len(events) == 2 + len(NAMES)
        times[events[0].step] = {e.wall_time for e in events}
    assert times == {0: {100.0}, 1: {101.0}}
