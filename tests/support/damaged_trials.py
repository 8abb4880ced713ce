"""A small real trial to damage, and the tools to damage its files, for the corrupt-file tests
(tests/reliability/test_corrupt_files.py) and the reader fuzz tests (tests/reliability/test_fuzz_readers.py).

    pristine = write_pristine(tmp_path / "clean")      # PyTorch hook, TRAIN steps 0-2, EVAL step 3
    run = copy_trial(pristine, tmp_path / "run")        # damage the copy, compare with pristine
    flip_byte(events_file(run, 1), 100)

``pristine.values`` and ``pristine.reductions`` hold what the reader returned for the undamaged
trial (checked against the values captured in the training process by test_corrupt_files.py), so
a damaged copy can be compared value by value.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mltrace.pytorch as smd
from mltrace.format.crc32c import crc32c
from mltrace.format.records import frame_record, unframe_record
from mltrace.trials import Trial, create_trial
from tests.support.torch_training import Captured, make_model

WORKER = "worker_0"
TRAIN_STEPS = 3
#: global step of the one EVAL step (mode step 0)
EVAL_STEP = TRAIN_STEPS
WEIGHT = "Sequential_0.weight"
GRAD = "gradient/Sequential_0.weight"
LOSS = "MSELoss_output_0"
INTS = "custom/ints"
TEXT = "custom/text"


@dataclass
class Pristine:
    """An undamaged trial and what it holds, by tensor name then global step."""

    path: Path
    captured: Captured
    values: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    reductions: dict[str, dict[int, dict[tuple[str, bool], np.ndarray]]] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)


def write_pristine(path: Path) -> Pristine:
    """Train a tiny model for TRAIN_STEPS steps and one EVAL step under a real PyTorch hook that
    saves weights, biases, gradients, the loss, stored reductions (mean, l2) and two save_tensor values
    (int16 and text); then read the whole trial back once as the reference."""
    model = make_model()
    loss_fn = torch.nn.MSELoss()
    hook = smd.Hook(
        out_dir=str(path), save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
        reduction_config=smd.ReductionConfig(reductions=["mean"], norms=["l2"], save_raw_tensor=True),
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(7)
    captured = Captured()
    for step in range(TRAIN_STEPS + 1):
        train_step = step < TRAIN_STEPS
        hook.set_mode(smd.modes.TRAIN if train_step else smd.modes.EVAL)
        x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)
        for name, p in model.named_parameters():
            captured.add(f"Sequential_{name}", step, p)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        hook.save_tensor(INTS, np.arange(6, dtype=np.int16).reshape(2, 3) * (step + 1), "custom")
        hook.save_tensor(TEXT, np.array(["start", f"step {step}"]), "custom")
        if train_step:
            loss.backward()
            for name, p in model.named_parameters():
                captured.add(f"gradient/Sequential_{name}", step, p.grad)
            opt.step()
        captured.add(LOSS, step, loss)
    hook.close()
    pristine = Pristine(path=Path(path), captured=captured)
    trial = create_trial(str(path))
    pristine.steps = trial.steps()
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        pristine.values[name] = tensor.values()
        pristine.reductions[name] = {s: tensor.reduction_values(s) for s in tensor.steps()}
    return pristine


def copy_trial(pristine: Pristine, dest: Path) -> Path:
    """A fresh copy of the pristine trial at ``dest``, to damage."""
    shutil.copytree(pristine.path, dest)
    return Path(dest)


def events_file(run: Path, step: int) -> Path:
    """The events file of a global step."""
    return Path(run) / "events" / f"{step:012d}" / f"{step:012d}_{WORKER}.tfevents"


def index_file(run: Path, step: int) -> Path:
    """The index file of a global step."""
    return Path(run) / "index" / "000000000" / f"{step:012d}_{WORKER}.json"


def collections_file(run: Path) -> Path:
    """The collections file of the only worker."""
    return Path(run) / "collections" / "000000000" / f"{WORKER}_collections.json"


def read_index(run: Path, step: int) -> dict[str, Any]:
    """The index JSON of a global step, parsed."""
    return json.loads(index_file(run, step).read_text())


def write_index(run: Path, step: int, doc: dict[str, Any]) -> None:
    """Replace the index of a global step (json.dumps' default separators, as the writer)."""
    index_file(run, step).write_text(json.dumps(doc))


def entry(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The tensor_payload entry of ``name`` in an index document."""
    return next(e for e in doc["tensor_payload"] if e["tensorname"] == name)


def flip_byte(path: Path, offset: int, mask: int = 0x01) -> None:
    """XOR one byte of a file with ``mask`` (negative offsets count from the end)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def payloads(run: Path, step: int) -> list[tuple[str, bytes]]:
    """(tensor name, Event payload) of each record of a step, in file order."""
    data = events_file(run, step).read_bytes()
    out = []
    for e in read_index(run, step)["tensor_payload"]:
        record = data[e["start_idx"]:e["start_idx"] + e["length"]]
        out.append((e["tensorname"], unframe_record(record, "pristine")))
    return out


def rewrite_step(run: Path, step: int, replace: dict[str, bytes], *, real_crc: bool = False,
                 index_crc: bool = True) -> None:
    """Write a step's events file and index again, as a writer would have, with the payloads
    named in ``replace`` swapped in: offsets, lengths and CRCs all consistent. ``real_crc`` puts
    the payload CRC in each record's footer (TensorBoard style); ``index_crc=False`` leaves the
    crc32c out of the index (smdebug style)."""
    doc = read_index(run, step)
    buffer = bytearray()
    entries = []
    for name, payload in payloads(run, step):
        payload = replace.get(name, payload)
        record = frame_record(payload, real_crc=real_crc)
        item: dict[str, Any] = {"tensorname": name, "start_idx": len(buffer), "length": len(record)}
        if index_crc:
            item["crc32c"] = crc32c(payload)
        entries.append(item)
        buffer += record
    doc["tensor_payload"] = entries
    events_file(run, step).write_bytes(bytes(buffer))
    write_index(run, step, doc)


def assert_same_value(actual: Any, expected: np.ndarray, what: str = "") -> None:
    """Equal dtype, shape and elements (NaN equal to NaN)."""
    assert isinstance(actual, np.ndarray), what
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (what, actual, expected)
    if expected.dtype.kind in "fc":
        assert np.array_equal(actual, expected, equal_nan=True), what
    else:
        assert np.array_equal(actual, expected), what


def open_trial(run: Path) -> Trial:
    """Open a (damaged) trial without waiting: its end marker says training ended."""
    return create_trial(str(run), timeout=0)
