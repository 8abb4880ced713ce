"""The flight recorder's ring of copies (mltrace.pytorch.copy_ring): a step's tensors copied into
preallocated slots read back as the reductions the recorder computed without it, whatever the
steps do (a tensor the layout does not have, a kept step holding its slot, a layout that keeps
changing, a budget too small), and a NaN in a copy is found by the step's check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.pytorch.adapter import TorchAdapter
from mltrace.pytorch.copy_ring import MISSES_TO_STOP, CopiedStep, CopyRing
from mltrace.trials import create_trial
from tests.support.flight_records import FIVE_REDUCTIONS
from tests.support.flight_training import POISONED, train

DEFAULT = [("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False)]
MEAN = [("mean", False)]


def _ring(ring_steps: int = 3, max_bytes: int = 1 << 20) -> tuple[TorchAdapter, CopyRing, object, object]:
    adapter = TorchAdapter()
    ring = CopyRing(DEFAULT, ring_steps, max_bytes, adapter)
    fallback = adapter.reducer(DEFAULT)
    return adapter, ring, ring.reducer(fallback), fallback


def _step(gen: torch.Generator, shapes: list[tuple[int, ...]], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [(torch.randn(*shape, generator=gen) * 10).to(dtype) for shape in shapes]


def _expected(adapter: TorchAdapter, fallback, tensors: list[torch.Tensor]) -> np.ndarray:
    """What the recorder keeps without copies: each tensor reduced as it comes."""
    return adapter.reductions_to_flat(adapter.pack_reductions([fallback(t) for t in tensors]))


LAYOUT = [(4, 3), (5,), (2, 2, 2)]


def test_copies_read_back_as_the_reductions_of_each_step_and_the_slots_are_reused():
    adapter, ring, reduce, fallback = _ring()
    gen = torch.Generator().manual_seed(0)
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])  # the first step teaches the layout
    assert ring.nbytes == 5 * 4 * sum(int(np.prod(s)) for s in LAYOUT)  # 3 ring steps + 2
    slots = set()
    for _ in range(12):
        tensors = _step(gen, LAYOUT)
        expected = _expected(adapter, fallback, tensors)
        handles = [reduce(t) for t in tensors]
        assert all(type(h) is torch.Tensor for h in handles)  # copied
        (step,) = ring.pack(handles)
        for t in tensors:
            t.mul_(0)  # the training changes its tensors in place afterwards: the copies do not
        assert type(step) is CopiedStep and step.finite(adapter)
        np.testing.assert_allclose(step.to_flat(adapter), expected, rtol=1e-6)
        slots.add(step.slot)
    assert slots == set(range(5))  # each step read and dropped: the slots go round


def test_values_of_a_step_are_those_it_was_given():
    adapter, ring, reduce, fallback = _ring()
    gen = torch.Generator().manual_seed(1)
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    history = []
    for _ in range(3):  # a ring of 3 keeps them all
        tensors = _step(gen, LAYOUT)
        expected = _expected(adapter, fallback, tensors)
        (step,) = ring.pack([reduce(t) for t in tensors])
        history.append((step, expected))
    for step, expected in history:  # read after later steps were copied
        np.testing.assert_allclose(step.to_flat(adapter), expected, rtol=1e-6)


def test_a_tensor_the_layout_does_not_have_is_reduced_with_the_rest_of_its_step():
    adapter, ring, reduce, fallback = _ring()
    gen = torch.Generator().manual_seed(2)
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    scalar = adapter.reducer(MEAN)
    # a smaller batch at the second position, and a loss's mean kept between the tensors
    tensors = _step(gen, [(4, 3), (3,), (2, 2, 2)])
    loss = torch.tensor(2.5)
    handles = [reduce(tensors[0]), scalar(loss), reduce(tensors[1]), reduce(tensors[2])]
    assert type(handles[0]) is torch.Tensor and type(handles[2]) is not torch.Tensor
    (step,) = ring.pack(handles)
    expected = np.concatenate([_expected(adapter, fallback, tensors[:1]), [2.5],
                               _expected(adapter, fallback, tensors[1:])])
    np.testing.assert_allclose(step.to_flat(adapter), expected, rtol=1e-6)
    assert step.finite(adapter)
    # the next step matches again and is copied whole
    tensors = _step(gen, LAYOUT)
    (step,) = ring.pack([reduce(t) for t in tensors])
    assert len(step.copies) == 3
    np.testing.assert_allclose(step.to_flat(adapter), _expected(adapter, fallback, tensors), rtol=1e-6)


def test_a_kept_step_keeps_its_slot_and_a_step_without_a_free_one_is_reduced():
    adapter, ring, reduce, fallback = _ring(ring_steps=1)  # 3 slots
    gen = torch.Generator().manual_seed(4)
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    held = []
    for _ in range(3):  # a dump that waits: every kept step still alive
        tensors = _step(gen, LAYOUT)
        held.append((ring.pack([reduce(t) for t in tensors])[0], _expected(adapter, fallback, tensors)))
    tensors = _step(gen, LAYOUT)
    handles = [reduce(t) for t in tensors]
    assert not any(type(h) is torch.Tensor for h in handles)  # no free slot: reduced as they came
    packed = ring.pack(handles)
    np.testing.assert_allclose(adapter.reductions_to_flat(packed), _expected(adapter, fallback, tensors), rtol=1e-6)
    for step, expected in held:  # none was overwritten
        np.testing.assert_allclose(step.to_flat(adapter), expected, rtol=1e-6)
    del held, step  # the steps leave the ring: their slots are free again
    (step,) = ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    assert type(step) is CopiedStep


@pytest.mark.parametrize("prefix", [[], LAYOUT[:1]], ids=["from-the-first", "after-a-copied-prefix"])
def test_a_layout_that_keeps_changing_gives_the_ring_up(prefix):
    adapter, ring, reduce, fallback = _ring()
    gen = torch.Generator().manual_seed(5)
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    for n in range(MISSES_TO_STOP):
        assert ring.nbytes > 0
        # another shape every step (a sequence length), after tensors that match the layout
        tensors = _step(gen, [*prefix, (n + 7,)])
        packed = ring.pack([reduce(t) for t in tensors])
        np.testing.assert_allclose(adapter.reductions_to_flat(packed), _expected(adapter, fallback, tensors), rtol=1e-6)
    assert ring.nbytes == 0 and ring.views == []
    tensors = _step(gen, LAYOUT)
    handles = [reduce(t) for t in tensors]
    assert not any(type(h) is torch.Tensor for h in handles)


def test_no_copies_beyond_the_bytes_allowed_and_none_of_what_a_float32_copy_would_change():
    adapter = TorchAdapter()
    gen = torch.Generator().manual_seed(6)
    for tensors, max_bytes in ((_step(gen, [(100, 100)]), 100 * 100 * 4 * 5 - 1),  # 5 slots do not fit
                               (_step(gen, LAYOUT, torch.float64), 1 << 20),  # float64: not exact in float32
                               ([torch.arange(12).reshape(3, 4)], 1 << 20)):  # ints
        ring = CopyRing(DEFAULT, 3, max_bytes, adapter)
        reduce = ring.reducer(adapter.reducer(DEFAULT))
        ring.pack([reduce(t) for t in tensors])
        assert ring.nbytes == 0
        assert not any(type(reduce(t)) is torch.Tensor for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_copies_read_back_as_the_reducer_computes_them(dtype):
    adapter, ring, reduce, fallback = _ring()
    gen = torch.Generator().manual_seed(7)
    ring.pack([reduce(t) for t in _step(gen, LAYOUT, dtype)])
    tensors = _step(gen, LAYOUT, dtype)
    (step,) = ring.pack([reduce(t) for t in tensors])
    assert len(step.copies) == 3
    np.testing.assert_array_equal(step.to_flat(adapter), _expected(adapter, fallback, tensors))


@pytest.mark.parametrize("position", range(len(LAYOUT)))
def test_a_nan_or_an_infinity_in_a_copy_fails_the_steps_check(position):
    adapter, ring, reduce, fallback = _ring()
    gen = torch.Generator().manual_seed(8)
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    for bad in (float("nan"), float("inf"), None):
        tensors = _step(gen, LAYOUT)
        if bad is not None:
            tensors[position].view(-1)[1] = bad
        (step,) = ring.pack([reduce(t) for t in tensors])
        assert step.total is not None  # the full slot was summed after its last copy
        assert step.finite(adapter) is (bad is None)
        flat = step.to_flat(adapter).reshape(3, 5)
        for i in range(len(LAYOUT)):
            assert bool(np.isfinite(flat[i][:2]).all()) == (bad is None or i != position)


def test_a_ring_whose_steps_are_not_checked_sums_nothing_and_a_partial_slot_is_summed_when_read():
    """Also: ``checked`` switched on while the ring records takes effect at the next step."""
    adapter = TorchAdapter()
    gen = torch.Generator().manual_seed(9)
    ring = CopyRing(DEFAULT, 3, 1 << 20, adapter, checked=False)
    reduce = ring.reducer(adapter.reducer(DEFAULT))
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    (step,) = ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    assert step.total is None and step.finite(adapter)
    ring.checked = True  # read at each step's last copy: switched on, the next step is summed
    (step,) = ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    assert step.total is not None and step.finite(adapter)
    _, ring, reduce, _ = _ring()
    ring.pack([reduce(t) for t in _step(gen, LAYOUT)])
    tensors = _step(gen, [LAYOUT[0], (9,)])  # the second tensor does not match: one copy
    tensors[0][0, 0] = float("nan")
    (step,) = ring.pack([reduce(t) for t in tensors])
    assert len(step.copies) == 1 and step.total is None and not step.finite(adapter)


def test_a_recorded_run_dumps_the_same_values_with_copies_and_without(tmp_path, monkeypatch):
    """The recorder's default reductions of every gradient and activation, dumped around a NaN,
    are those the recorder computes without copies (the same run, copies turned off)."""
    config = FlightRecorderConfig(steps=20, after_steps=5, collections=["gradients", "activations", "losses"],
                                  reductions=list(FIVE_REDUCTIONS))
    with_copies = str(tmp_path / "copies")
    train(with_copies, steps=40, poison_step=30, recorder=config)
    monkeypatch.setattr(TorchAdapter, "step_copies", lambda self, *args: None)
    without = str(tmp_path / "reduced")
    run = train(without, steps=40, poison_step=30, recorder=config)
    assert run.max_ring_bytes < 100_000  # reductions only, against the slots' ~300 KB below
    a, b = create_trial(with_copies), create_trial(without)
    assert a.steps() == b.steps() == [0] + list(range(10, 36))
    names = a.tensor_names()
    assert names == b.tensor_names() and POISONED in names
    compared = 0
    for name in names:
        for step in a.tensor(name).steps():
            for red in FIVE_REDUCTIONS:
                x = a.tensor(name).reduction_value(step, red)
                y = b.tensor(name).reduction_value(step, red)
                if x is None and y is None:
                    continue
                np.testing.assert_allclose(x, y, rtol=1e-5, err_msg=f"{name} {red} at step {step}")
                compared += 1
    assert compared > 1000


def test_the_recorders_memory_counts_the_slots(tmp_path):
    config = FlightRecorderConfig(steps=20, after_steps=5, collections=["gradients", "activations"],
                                  reductions=list(FIVE_REDUCTIONS))
    run = train(str(tmp_path / "run"), steps=25, poison_step=None, recorder=config)
    # 15 tensors of the test network (about 3,800 floats a step) in 22 slots, and the ring's own
    assert 22 * 4 * 3_500 < run.max_ring_bytes <= config.memory_budget
