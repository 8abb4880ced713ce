"""A PyTorch training run whose disk fills up mid-run and gets space again, for test_faults.py.

The disk is real, in one of two ways:

* ``TmpfsDisk``: a small tmpfs mounted by the test; ``fill()`` writes a filler file until the
  kernel says ENOSPC, then gives back a few pages, so that the next file is cut off half-way;
  ``free()`` deletes the filler.
* ``FsizeDisk`` (where mounting is not permitted): RLIMIT_FSIZE of this process, lowered by
  ``fill()`` to a few KiB with SIGXFSZ ignored, so the kernel cuts writes there and then fails
  them with EFBIG; ``free()`` lifts it. It must run in a child process: ``python -m
  tests.support.fault_training SPECS.json RESULT.pkl`` runs ``run_full_disk`` once per spec (a list of
  keyword arguments; one process for several runs, since importing torch takes seconds) and
  pickles the outcomes once the limit is lifted again.

``run_full_disk`` trains BEFORE steps, fills the disk, trains DURING steps, frees it and trains
AFTER steps (or, with ``fault_at_close``, fills the disk after BEFORE steps and closes), saving
every step; it records what training computed, what mltrace logged and what it raised.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import pickle
import resource
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

import mltrace.pytorch as smd
from tests.support.processes import child_pids
from tests.support.torch_training import Captured, train

BEFORE, DURING, AFTER = 10, 10, 5
LOSS = "MSELoss_output_0"
#: Bytes a filled tmpfs keeps free (two pages): less than one step's events file (~13 KB), more
#: than its index file, so that a step's events file is cut off while its index would still fit.
SLACK = 8192
#: RLIMIT_FSIZE while "full": the same cut for a child process.
FSIZE_LIMIT = 4096


class Disk(Protocol):
    """A filesystem that a test fills and frees while training runs."""

    kind: str

    def fill(self) -> None:
        """Leave (almost) no space: the next step's files cannot be written whole."""

    def free(self) -> None:
        """Give the space back."""


class TmpfsDisk:
    """A mounted tmpfs at ``root``, filled by a real file."""

    kind = "tmpfs"

    def __init__(self, root: str, slack: int = SLACK) -> None:
        self.filler = os.path.join(root, "filler")
        self.slack = slack

    def fill(self) -> None:
        chunk = b"\0" * 65536
        with open(self.filler, "wb", buffering=0) as f:
            while True:
                try:
                    f.write(chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        os.truncate(self.filler, max(0, os.path.getsize(self.filler) - self.slack))

    def free(self) -> None:
        os.remove(self.filler)


class FsizeDisk:
    """RLIMIT_FSIZE of this process and its children (the trial writer's process writes the
    files): files are cut at ``limit`` bytes, then writes fail (EFBIG)."""

    kind = "rlimit"

    def __init__(self, limit: int = FSIZE_LIMIT) -> None:
        self.limit = limit
        self.hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process

    def fill(self) -> None:
        limit_file_size(self.limit, self.hard)

    def free(self) -> None:
        limit_file_size(self.hard, self.hard)


def limit_file_size(soft: int, hard: int) -> None:
    """RLIMIT_FSIZE of this process and of the processes it started (its trial writer's)."""
    for pid in (0, *child_pids()):
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
        except ProcessLookupError:  # exited since it was listed
            continue


@dataclass
class Outcome:
    """What a run did, as the test needs it (picklable, to come back from a child process)."""

    disk: str
    steps_total: int
    steps_done: int = 0
    captured: dict = field(default_factory=dict)  # name -> {step: value}, from tests.support.torch_training
    errors: list[tuple[str, str]] = field(default_factory=list)  # (logger, message) at ERROR
    raised: tuple[str, str, str] | None = None  # (type, message, location) of what training got
    raised_at: int | None = None  # the step whose hook call raised; None if it came from close()
    write_failures: int = 0  # files the trial writer could not write
    tensorboard_failures: int = 0


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name, record.getMessage()))


def _settle(hook: smd.Hook) -> None:
    """Wait until what the hook handed its background writers is on disk (or failed)."""
    if hook.writer is not None:
        hook.writer.flush()
    if hook.tensorboard is not None:
        hook.tensorboard.flush()


def _await_failure(hook: smd.Hook, timeout: float = 60.0) -> None:
    """Wait until the trial writer knows a write failed (its process reports within a batch
    interval; on a loaded machine that can take longer than the DURING steps of a small MLP),
    so that when a strict hook raises depends on the hook, not on the machine's load."""
    deadline = time.monotonic() + timeout
    while hook.writer is not None and not hook.writer.failures.count and time.monotonic() < deadline:
        time.sleep(0.01)


def run_full_disk(out_dir: str, disk: Disk, strict: bool = False, export_tensorboard: bool = False,
                  fault_at_close: bool = False, tensorboard_dir: str | None = None,
                  raw_weights: bool = True) -> Outcome:
    """Train a small MLP, saving every step to ``out_dir`` on ``disk``, which fills after BEFORE
    steps; see the module docstring. Never raises what training got: it is in the Outcome.

    ``raw_weights=False`` saves weights only as TensorBoard histograms and no gradients, so the
    trial's files stay a few hundred bytes (below FSIZE_LIMIT) while the export grows past it.
    """
    recorder = _Recorder()
    mltrace_logger = logging.getLogger("mltrace")
    mltrace_logger.addHandler(recorder)
    total = BEFORE if fault_at_close else BEFORE + DURING + AFTER
    outcome = Outcome(disk=disk.kind, steps_total=total)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 1))  # ~13 KB per step
    loss_fn = nn.MSELoss()
    collections = ["weights", "gradients", "losses"] if raw_weights else ["weights", "losses"]
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), strict=strict,
                    include_collections=collections, export_tensorboard=export_tensorboard,
                    tensorboard_dir=tensorboard_dir)
    if not raw_weights:
        hook.get_collection("weights").reduction_config = smd.ReductionConfig(save_raw_tensor=False)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    captured = Captured()
    full = False
    writer, tensorboard = hook.writer, hook.tensorboard
    try:
        for step in range(total):
            if step == BEFORE and not fault_at_close:
                _settle(hook)
                disk.fill()
                full = True
            if step == BEFORE + DURING:
                _settle(hook)
                disk.free()
                full = False
            train(model, hook, 1, captured=captured, loss_fn=loss_fn, start=step)
            outcome.steps_done += 1
            if strict and raw_weights and step == BEFORE:
                _await_failure(hook)
            writer, tensorboard = hook.writer, hook.tensorboard
        if fault_at_close:
            _settle(hook)
            disk.fill()
            full = True
    except Exception as exc:  # strict=True: what the user's training loop gets
        outcome.raised = (type(exc).__name__, str(exc), getattr(exc, "location", ""))
        outcome.raised_at = outcome.steps_done
        if full:  # the user frees space before the hook closes (at exit, say)
            disk.free()
            full = False
    try:
        hook.close()
    except Exception as exc:
        if outcome.raised is None:
            outcome.raised = (type(exc).__name__, str(exc), getattr(exc, "location", ""))
    finally:
        if full:
            disk.free()
        mltrace_logger.removeHandler(recorder)
    outcome.captured = captured.values
    outcome.errors = recorder.records
    outcome.write_failures = writer.failures.count if writer is not None else 0
    outcome.tensorboard_failures = tensorboard.failures.count if tensorboard is not None else 0
    return outcome


def main(argv: list[str]) -> int:
    """``SPECS.json RESULT.pkl``: run_full_disk(**spec) on an FsizeDisk for each spec, pickle
    the outcomes' fields (dicts: this module runs as __main__ here, so its classes would not
    unpickle elsewhere)."""
    specs_path, result_path = argv
    with open(specs_path) as f:
        specs = json.load(f)
    disk = FsizeDisk()
    outcomes = [dataclasses.asdict(run_full_disk(disk=disk, **spec)) for spec in specs]
    with open(result_path, "wb") as f:  # the limit is lifted again: this file is whole
        pickle.dump(outcomes, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
