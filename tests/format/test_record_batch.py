"""Many records of one tensor decoded at once (mltrace.format.record_batch, behind
``Trial.read_tensors``), and many tensors' reductions at once (mltrace.reductions.compute_rows):
the same arrays and numbers as one by one, for every dtype and shape, across step numbers whose
varints differ in length; a damaged record fails as it would alone."""

from __future__ import annotations

import numpy as np
import pytest

from mltrace.exceptions import CorruptRecordError
from mltrace.format import record_batch
from mltrace.reductions import REDUCTION_NAMES, compute_many, compute_rows
from mltrace.trials import create_trial
from mltrace.trials.index import Location
from tests.support.rule_trials import write_trial

#: Records of one tensor are decoded in bulk by groups of one length (the step's varint and the
#: mode step's digits set it): 1-5 are one group, 128-302 another, the rest are too few.
STEPS = [0, 1, 2, 3, 4, 5, 126, 127, 128, 129, 130, 300, 301, 302, 16383, 16384]
VALUES = {
    "f32": lambda s: np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) * (s + 1),
    "f64_scalar": lambda s: np.float64(s) / 7,
    "f16": lambda s: np.arange(5, dtype=np.float16) - s % 3,
    "i64": lambda s: np.arange(4, dtype=np.int64) * s,
    "u8": lambda s: np.full(3, s % 256, dtype=np.uint8),
    "bool": lambda s: np.array([s % 2 == 0, True]),
    "c64": lambda s: np.array([1 + 1j * s, -s], dtype=np.complex64),
    "nonfinite": lambda s: np.array([np.nan if s % 2 else np.inf, s], dtype=np.float32),
    "text": lambda s: np.array([f"step {s}"]),
}


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    path = tmp_path_factory.mktemp("batch") / "run"
    write_trial(path, {s: {n: make(s) for n, make in VALUES.items()} for s in STEPS})
    return create_trial(str(path))


def _locations(trial, name: str) -> list[Location]:
    values = trial.index_entries(name).values
    return [values[s]["worker_0"] for s in STEPS]


@pytest.mark.parametrize("name", sorted(VALUES))
def test_a_batch_decodes_what_one_by_one_does(trial, name):
    locations = _locations(trial, name)
    together = trial.read_tensors(locations)
    for step, got, loc in zip(STEPS, together, locations):
        alone = trial.read_tensor(loc, name, step)
        assert isinstance(got, np.ndarray) and got.shape == alone.shape
        assert got.dtype == alone.dtype and got.tobytes() == alone.tobytes(), (name, step)
    want = np.asarray(VALUES[name](STEPS[-1]))
    assert np.array_equal(together[-1], want, equal_nan=want.dtype.kind in "fc")


def test_records_of_many_tensors_interleaved_come_back_in_order(trial):
    names = sorted(n for n in VALUES if n != "text")
    locations = [loc for step_locs in zip(*(_locations(trial, n) for n in names))
                 for loc in step_locs]
    together = trial.read_tensors(locations)
    for k, got in enumerate(together):
        step, name = STEPS[k // len(names)], names[k % len(names)]
        assert np.array_equal(got, np.asarray(VALUES[name](step)), equal_nan=True), (name, step)


def test_a_damaged_record_in_a_batch_fails_as_it_would_alone(trial):
    locations = _locations(trial, "f32")
    records = [trial.storage.read(loc.key, loc.start, loc.length) for loc in locations]
    k = STEPS.index(300)  # in a group decoded in bulk, not its first record
    assert len({len(records[i]) for i in range(k - 3, k + 3)}) == 1
    broken = bytearray(records[k])
    broken[records[k].index(VALUES["f32"](300).tobytes()) + 5] ^= 0x01  # one bit of a value
    records[k] = bytes(broken)
    with pytest.raises(CorruptRecordError, match="payload CRC32C"):
        record_batch.decode_records(records, locations, trial._decode_record)
    # without the damaged one the others decode
    rest = record_batch.decode_records(records[:k] + records[k + 1:],
                                       locations[:k] + locations[k + 1:], trial._decode_record)
    assert np.array_equal(rest[k], VALUES["f32"](STEPS[k + 1]))


def test_a_record_of_another_tensor_in_a_batch_is_refused(trial):
    locations = _locations(trial, "f32")
    other = _locations(trial, "i64")[3]
    wrong = Location(other.key, other.start, other.length, other.crc32c, "f32")
    with pytest.raises(CorruptRecordError, match="not a record of 'f32'"):
        trial.read_tensors(locations[:3] + [wrong])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.uint8,
                                   np.bool_, np.complex64])
@pytest.mark.parametrize("shape", [(40, 16), (9, 3, 7), (25,), (6, 1000)])
def test_reductions_of_a_stack_equal_each_tensors_own(dtype, shape):
    rng = np.random.default_rng(7)
    stack = (rng.standard_normal(shape) * 100).astype(dtype)
    if np.dtype(dtype).kind == "f":
        flat = stack.reshape(-1)
        flat[::17], flat[5], flat[9] = 0, np.nan, np.inf
    names = [*REDUCTION_NAMES, *(f"abs_{n}" for n in REDUCTION_NAMES)]
    rows = compute_rows(stack, names)
    for i, tensor in enumerate(stack):
        for statistic, value in compute_many(tensor, names).items():
            got = rows[statistic][i]
            assert got.dtype == value.dtype and np.array_equal(got, value, equal_nan=True), (
                statistic, i)


def test_reductions_of_an_empty_stack_are_none():
    assert compute_rows(np.empty((0, 4), dtype=np.float32), ["l2"]) == {}
    assert compute_rows(np.array([["a"], ["b"]]), ["l2"]) == {}


def test_only_the_first_record_of_a_group_is_decoded_field_by_field(trial):
    locations = _locations(trial, "f32")
    records = [trial.storage.read(loc.key, loc.start, loc.length) for loc in locations]
    alone: list[int] = []

    def one(record: bytes, loc: Location) -> np.ndarray:
        alone.append(loc.start)
        return trial._decode_record(record, loc)

    record_batch.decode_records(records, locations, one)
    # groups: step 0; 1-5; 126-127 (too few); 128-302; 16383; 16384
    assert len(alone) == 1 + 1 + 2 + 1 + 1 + 1
