"""TensorBoard export of hooks: bytes equal torch's SummaryWriter, files TensorBoard's Python
loader reads whole and in order, real CRCs, one appended file per mode, writes off the training
thread. (The Rust loader, ``--load_fast=true``, reads the same files in test_tb_browser.py.)"""

from __future__ import annotations

import glob
import os
import threading
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.compat.proto import event_pb2, summary_pb2
from torch import nn
from torch.utils.tensorboard import summary as torch_summary
from torch.utils.tensorboard import writer as torch_writer

import mltrace.pytorch as smd
from mltrace.format.events import (
    encode_file_version_event,
    encode_histogram_event,
    encode_scalar_event,
)
from mltrace.format.records import iter_records
from mltrace.modes import ModeKeys
from mltrace.storage import register_scheme
from mltrace.trials import create_trial
from mltrace.writer import tensorboard as tbx
from mltrace.writer.histogram_bins import SEARCH_EACH_LIMIT, bin_values
from tests.support.memory_storage import MemoryStorage
from tests.support.torch_training import make_model, train

LOSS = "MSELoss_output_0"


@pytest.fixture(scope="module")
def torch_bins(tmp_path_factory):
    """The bucket edges a real SummaryWriter uses for add_histogram(bins="tensorflow")."""
    writer = torch_writer.SummaryWriter(str(tmp_path_factory.mktemp("torch_tb")))
    writer.close()
    return writer.default_bins


def _torch_event(summary: summary_pb2.Summary, step: int, wall_time: float) -> bytes:
    return event_pb2.Event(summary=summary, step=step, wall_time=wall_time).SerializeToString()


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).normal(0, 0.05, 10_000).astype(np.float32),
    np.random.default_rng(1).normal(3, 100, (64, 33)),
    np.arange(-5, 7, dtype=np.int64),
    np.array([0.0, 0.0, 1e-13, -1e-13]),
    np.array([2.5]),
    np.array([-7.0, -7.0, -7.0]),
    np.array([1e-30, 1e19, -3e18], dtype=np.float64),
    np.array([-1e21, 0.5, 2e20]),  # beyond the outer edges: counted in num, in no bucket
    np.concatenate([tbx.DEFAULT_BINS[::5], tbx.DEFAULT_BINS[-1:], [1.0]]),  # on the edges
    np.concatenate([tbx.DEFAULT_BINS[::2], [-1e25]]),  # on the edges, sorted path
])
def test_histogram_equals_torch_add_histogram(values, torch_bins):
    """Bytes equal to torch's but for sum_squares, which mltrace sums with einsum where torch
    calls BLAS's dot (see mltrace.writer.histogram_bins): the two may differ in the last bits."""
    assert tbx.DEFAULT_BINS.tolist() == torch_bins
    ours = encode_histogram_event("weights/fc.weight", tbx.histogram_fields(values), 12, 1700000000.5)
    theirs = _torch_event(torch_summary.histogram("weights/fc.weight", values, torch_bins), 12, 1700000000.5)
    parsed, expected = (event_pb2.Event.FromString(e) for e in (ours, theirs))
    got, want = parsed.summary.value[0].histo, expected.summary.value[0].histo
    assert got.sum_squares == pytest.approx(want.sum_squares, rel=1e-14)
    got.sum_squares = want.sum_squares
    assert parsed.SerializeToString() == theirs
    assert got.num == values.size and sum(got.bucket) == np.count_nonzero(np.abs(values) <= 1e20)


@pytest.mark.parametrize("size", [1, 2, SEARCH_EACH_LIMIT, SEARCH_EACH_LIMIT + 1, 5000])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_both_binning_paths_count_as_np_histogram(size, dtype):
    """Few values are searched one by one, many are sorted: either way the counts are
    np.histogram's, for values of every magnitude, the outer edges and non-finite ones."""
    rng = np.random.default_rng(size)
    with np.errstate(over="ignore"):  # float16 holds neither the large values nor the edges
        values = (rng.standard_normal(size) * 10.0 ** rng.uniform(-14, 22, size)).astype(dtype)
        values[::7] = tbx.DEFAULT_BINS[rng.integers(0, len(tbx.DEFAULT_BINS), values[::7].size)].astype(dtype)
    values[1::11] = np.nan
    finite = values[np.isfinite(values)].astype(np.float64)
    binned = bin_values(values)
    if finite.size == 0:
        assert binned is None
        return
    np.testing.assert_array_equal(binned.counts, np.histogram(finite, bins=tbx.DEFAULT_BINS)[0])
    assert (binned.min, binned.max, binned.num) == (finite.min(), finite.max(), finite.size)


def test_scalar_and_file_version_bytes_parse_with_tensorboard_protos():
    for value in (0.0, -1.5, 3.25e-7):
        ours = encode_scalar_event("loss", value, 3, 1700000000.25)
        assert ours == _torch_event(torch_summary.scalar("loss", value), 3, 1700000000.25)
    header = event_pb2.Event.FromString(encode_file_version_event(1700000000.0))
    assert header.file_version == "brain.Event:2" and header.source_metadata.writer == "mltrace"
    assert header.wall_time == 1700000000.0


def test_tensorboard_gives_our_values_the_scalars_and_histograms_plugins():
    from tensorboard import data_compat, dataclass_compat

    scalar = event_pb2.Event.FromString(encode_scalar_event("loss", 0.5, 1, 1.0)).summary.value[0]
    histo = event_pb2.Event.FromString(
        encode_histogram_event("w", tbx.histogram_fields(np.arange(10.0)), 1, 1.0)).summary.value[0]
    for value, plugin, data_class in ((scalar, "scalars", summary_pb2.DATA_CLASS_SCALAR),
                                      (histo, "histograms", summary_pb2.DATA_CLASS_TENSOR)):
        migrated = data_compat.migrate_value(value)
        assert migrated.metadata.plugin_data.plugin_name == plugin
        event = event_pb2.Event(summary=summary_pb2.Summary(value=[migrated]))
        out = list(dataclass_compat.migrate_event(event, {}))
        assert out[0].summary.value[0].metadata.data_class == data_class


def test_histograms_leave_out_what_tensorboard_cannot_draw():
    assert tbx.histogram_fields(np.array([True, False])) is None
    assert tbx.histogram_fields(np.zeros((0, 3))) is None
    assert tbx.histogram_fields(np.array([np.nan, np.inf])) is None
    assert tbx.histogram_fields(np.array([1 + 2j])) is None
    with_nan = event_pb2.Event.FromString(encode_histogram_event(
        "t", tbx.histogram_fields(np.array([1.0, np.nan, 2.0, -np.inf])), 1, 1.0)).summary.value[0].histo
    assert (with_nan.num, with_nan.min, with_nan.max) == (2, 1.0, 2.0)
    assert tbx.clean_tag("/a b:0/c+d") == "a_b_0/c_d"


def _train(out_dir, steps=5, eval_steps=2, **kwargs):
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"], **kwargs)
    model, loss_fn = make_model(), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    train(model, hook, steps, loss_fn=loss_fn)
    hook.save_scalar("lr", 0.1)
    train(model, hook, eval_steps, mode=smd.modes.EVAL, loss_fn=loss_fn, start=steps)
    hook.close()
    return hook


def _accumulator(folder):
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def test_hook_export_is_read_whole_and_in_order_by_tensorboard(tmp_path):
    _train(tmp_path / "run", export_tensorboard=True)
    tb = tmp_path / "run" / "tensorboard"
    assert sorted(os.listdir(tb)) == ["EVAL", "TRAIN"]
    trial = create_trial(str(tmp_path / "run"))
    for mode, steps in (("TRAIN", range(5)), ("EVAL", range(5, 7))):
        files = glob.glob(str(tb / mode / "*"))
        assert len(files) == 1 and os.path.basename(files[0]).startswith("events.out.tfevents.")
        acc = _accumulator(tb / mode)
        losses = acc.Scalars(LOSS)
        assert [e.step for e in losses] == list(steps)  # global steps, as smdebug's export
        expected = [float(np.float32(trial.tensor(LOSS).value(s))) for s in steps]
        assert [e.value for e in losses] == expected
        assert [e.step for e in acc.Histograms("weights/Sequential_0.weight")] == list(steps)
    train_tags = _accumulator(tb / "TRAIN").Tags()
    assert "scalar/lr" in train_tags["scalars"]  # save_scalar, in the step (and mode) it was called in
    assert "gradients/Sequential_0.weight" in train_tags["histograms"]
    assert not any(t.startswith("losses/") for t in train_tags["histograms"])  # scalar collections: no histograms
    assert "gradients/Sequential_0.weight" not in _accumulator(tb / "EVAL").Tags()["histograms"]


def test_histogram_tags_do_not_repeat_the_collection_prefix(tmp_path):
    _train(tmp_path / "run", steps=2, eval_steps=0, export_tensorboard=True)
    tags = _accumulator(tmp_path / "run" / "tensorboard" / "TRAIN").Tags()["histograms"]
    assert not any(t.startswith("gradients/gradient/") for t in tags), tags
    grads = sorted(t for t in tags if t.startswith("gradients/"))
    assert grads == ["gradients/Sequential_0.bias", "gradients/Sequential_0.weight",
                     "gradients/Sequential_2.bias", "gradients/Sequential_2.weight"]
    assert len(tags) == len(set(tags))


def test_histogram_tags_stay_unique_when_short_tags_meet(tmp_path):
    writer = tbx.TensorBoardWriter(str(tmp_path / "tb"))
    assert tbx.histogram_tag("gradients", "gradients/net/d1/kernelGrad") == "gradients/net/d1/kernelGrad"
    assert tbx.histogram_tag("weights", "Sequential_0.weight") == "weights/Sequential_0.weight"
    tags = [writer.histogram_tag("gradients", n) for n in ("gradient/w", "w", "gradient/w", "gradients/w")]
    assert tags == ["gradients/w", "gradients/w_1", "gradients/w", "gradients/gradients/w"]
    writer.close()


def test_export_files_start_with_file_version_and_carry_real_crcs(tmp_path):
    _train(tmp_path / "run", steps=3, eval_steps=0, export_tensorboard=True)
    (path,) = glob.glob(str(tmp_path / "run" / "tensorboard" / "TRAIN" / "*"))
    with open(path, "rb") as f:
        records = list(iter_records(f.read(), path, check_data="real"))
    first = event_pb2.Event.FromString(records[0][1])
    assert first.file_version == "brain.Event:2"
    events = [event_pb2.Event.FromString(p) for _, p in records[1:]]
    steps = [e.step for e in events]
    assert steps == sorted(steps) and set(steps) == {0, 1, 2}


def test_long_run_keeps_every_step_when_tensorboard_keeps_all(tmp_path):
    writer = tbx.TensorBoardWriter(str(tmp_path / "tb"), flush_secs=0.05)
    for step in range(1500):
        writer.add_scalar(ModeKeys.TRAIN, step, "loss", 1.0 / (step + 1))
        if step % 3 == 0:
            writer.add_histogram(ModeKeys.TRAIN, step, "weights/w", np.full(10, step, dtype=np.float32))
    writer.close()
    acc = _accumulator(tmp_path / "tb" / "TRAIN")
    assert [e.step for e in acc.Scalars("loss")] == list(range(1500))
    assert [e.step for e in acc.Histograms("weights/w")] == list(range(0, 1500, 3))


def test_one_file_per_mode_is_appended_and_flushed_in_the_background(tmp_path):
    writer = tbx.TensorBoardWriter(str(tmp_path / "tb"), flush_secs=0.05)
    writer.add_scalar(ModeKeys.TRAIN, 0, "loss", 1.0)
    deadline = time.monotonic() + 5
    while not glob.glob(str(tmp_path / "tb" / "TRAIN" / "*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    (path,) = glob.glob(str(tmp_path / "tb" / "TRAIN" / "*"))  # flushed without close
    size = os.path.getsize(path)
    writer.add_scalar(ModeKeys.TRAIN, 1, "loss", 0.5)
    writer.flush()
    assert os.path.getsize(path) > size and glob.glob(str(tmp_path / "tb" / "TRAIN" / "*")) == [path]
    writer.close()
    writer.add_scalar(ModeKeys.TRAIN, 2, "loss", 0.25)  # after close: ignored, never raises
    assert [e.step for e in _accumulator(tmp_path / "tb" / "TRAIN").Scalars("loss")] == [0, 1]


def test_small_steps_are_encoded_at_their_end_large_ones_by_the_thread(tmp_path, monkeypatch):
    """A step's summaries are handed on together at end_step (or every SUBMIT_EVERY): a step
    with few histogram values is encoded there, on the training thread; a larger one by the
    background thread. The events keep the order of their steps either way."""
    encoded_on: list[tuple[int, str]] = []
    real = tbx.histogram_field_parts

    def recording(values):
        encoded_on.append((values.size, threading.current_thread().name))
        return real(values)

    monkeypatch.setattr(tbx, "histogram_field_parts", recording)
    writer = tbx.TensorBoardWriter(str(tmp_path / "tb"))
    small, large = np.linspace(-1, 1, 100, dtype=np.float32), np.ones(tbx.INLINE_VALUES + 1, np.float32)
    for step in range(6):
        writer.add_scalar(ModeKeys.TRAIN, step, "loss", float(step))
        writer.add_histogram(ModeKeys.TRAIN, step, "w", large if step in (2, 3) else small)
        writer.end_step()
        if step == 3:
            writer.flush()  # a small step behind a large one still queued would go to the thread
    for i in range(tbx.SUBMIT_EVERY + 6):  # a step with more summaries than a batch holds
        writer.add_scalar(ModeKeys.TRAIN, 6, f"s{i}", float(i))
    writer.close()
    here = threading.current_thread().name
    assert [(size, name == here) for size, name in encoded_on] == [
        (100, True), (100, True), (large.size, False), (large.size, False), (100, True), (100, True)]
    acc = _accumulator(tmp_path / "tb" / "TRAIN")
    assert [e.step for e in acc.Scalars("loss")] == list(range(6))
    assert [e.step for e in acc.Histograms("w")] == list(range(6))
    assert len(acc.Tags()["scalars"]) == 1 + tbx.SUBMIT_EVERY + 6


def test_training_thread_does_not_wait_for_binning_or_disk(tmp_path, monkeypatch):
    release = threading.Event()
    real = tbx.histogram_field_parts

    def slow(values):
        release.wait(10)
        return real(values)

    monkeypatch.setattr(tbx, "histogram_field_parts", slow)
    writer = tbx.TensorBoardWriter(str(tmp_path / "tb"))
    values = np.ones(tbx.INLINE_VALUES + 1, dtype=np.float32)  # too many to bin on this thread
    start = time.perf_counter()
    for step in range(20):
        writer.add_histogram(ModeKeys.TRAIN, step, "w", values)
        writer.end_step()
        values[:] = step + 2  # the caller reuses its buffer (an optimizer updating weights in place)
    assert time.perf_counter() - start < 1.0
    release.set()
    writer.close()
    histos = _accumulator(tmp_path / "tb" / "TRAIN").Histograms("w")
    assert [h.histogram_value.max for h in histos] == [1.0] + [float(s + 2) for s in range(19)]


def test_object_stores_get_one_complete_file_per_flush(tmp_path):
    register_scheme("memtb", MemoryStorage)
    writer = tbx.TensorBoardWriter("memtb://bucket/run/tensorboard", worker="worker_1")
    writer.add_scalar(ModeKeys.TRAIN, 0, "loss", 1.0)
    writer.flush()
    time.sleep(1.05)  # file names carry seconds: the next file must sort after this one
    writer.add_scalar(ModeKeys.TRAIN, 1, "loss", 0.5)
    writer.close()
    keys = sorted(k for k in MemoryStorage.files if k.startswith("bucket/run/tensorboard/"))
    assert len(keys) == 2 and all(k.startswith("bucket/run/tensorboard/TRAIN/worker_1/events.out.tfevents.") for k in keys)
    steps = []
    for key in keys:
        records = [event_pb2.Event.FromString(p) for _, p in iter_records(MemoryStorage.files[key], key, "real")]
        assert records[0].file_version == "brain.Event:2"
        steps += [e.step for e in records[1:]]
    assert steps == [0, 1]


def test_tensorboard_dir_wins_and_dry_run_writes_nothing(tmp_path):
    _train(tmp_path / "run", steps=2, eval_steps=0, tensorboard_dir=str(tmp_path / "elsewhere"))
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert [e.step for e in _accumulator(tmp_path / "elsewhere" / "TRAIN").Scalars(LOSS)] == [0, 1]
    _train(tmp_path / "dry", steps=2, eval_steps=0, export_tensorboard=True, dry_run=True)
    assert not (tmp_path / "dry").exists()
    assert tbx.resolve_tensorboard_dir("s3://b/run/", True, None) == "s3://b/run/tensorboard"
    assert tbx.resolve_tensorboard_dir("/x", False, None) is None


def test_bfloat16_tensors_are_binned_by_value(tmp_path):
    import torch

    hook = smd.Hook(out_dir=str(tmp_path / "run"), export_tensorboard=True, save_config=smd.SaveConfig(save_interval=1))
    hook.set_mode(smd.modes.TRAIN)
    hook.begin_step()
    hook.save_tensor("bf", torch.tensor([1.5, -2.25, 4.0], dtype=torch.bfloat16), "weights")
    hook.close()
    (histo,) = _accumulator(tmp_path / "run" / "tensorboard" / "TRAIN").Histograms("weights/bf")
    assert (histo.histogram_value.min, histo.histogram_value.max, histo.histogram_value.num) == (-2.25, 4.0, 3)
