"""Faults inside mltrace during a user's training, each injected for real: a full disk (a small
tmpfs filled by a file; where mounting is not permitted, RLIMIT_FSIZE in a child process, so the
kernel answers EFBIG), an S3 outage (the SeaweedFS server stopped) with and without room for the
spill, an MLflow store that disappears, a sink whose reader process exits, a tensor the encoder
cannot handle.

Without strict: training finishes every step, the fault is logged once (plus a summary at
close), every step written before it stays readable with the values training computed, no file
is half there, and mltrace keeps trying: steps after the disk got space again are saved. With
strict=True the training loop gets the error instead (spilling during an S3 outage is not one).

The module ends by printing its figures (faults injected, training steps completed, steps lost
before a fault) in one line, for docs/reliability.md.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator as ea
from torch import nn

import mltrace.pytorch as smd
from mltrace.format.records import iter_records
from mltrace.trials import create_trial
from tests.support.fault_training import (
    AFTER,
    BEFORE,
    DURING,
    LOSS,
    Outcome,
    TmpfsDisk,
    run_full_disk,
)
from tests.support.s3_process import RestartableS3
from tests.support.torch_training import Captured, make_model, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The file of the step that was open when the disk filled: the first one mltrace cannot write.
FIRST_LOST = f"events/{BEFORE - 1:012d}/{BEFORE - 1:012d}_worker_0.tfevents"
DISK_FULL_CAUSES = ("No space left on device", "File too large")  # ENOSPC (tmpfs), EFBIG (rlimit)

FIGURES = {"faults": 0, "steps_completed": 0, "steps_expected": 0, "steps_lost_before_fault": 0,
           "files_refused": 0}


def _account(faults: int = 1, completed: int = 0, expected: int = 0, lost: int = 0,
             refused: int = 0) -> None:
    FIGURES["faults"] += faults
    FIGURES["steps_completed"] += completed
    FIGURES["steps_expected"] += expected
    FIGURES["steps_lost_before_fault"] += lost
    FIGURES["files_refused"] += refused


@pytest.fixture(scope="module", autouse=True)
def _print_figures(request) -> Iterator[None]:
    yield
    line = (f"mltrace fault injection: {FIGURES['faults']} faults injected, "
            f"{FIGURES['steps_completed']}/{FIGURES['steps_expected']} training steps completed, "
            f"{FIGURES['steps_lost_before_fault']} steps lost before a fault, "
            f"{FIGURES['files_refused']} file writes refused by the disk or store")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print("\n" + line)
    logging.getLogger(__name__).info(line)


# -- a full disk ---------------------------------------------------------------------------------
@dataclass
class DiskSetup:
    """Where a run's out_dir goes, and how its disk gets full (kind "tmpfs" or "rlimit")."""

    kind: str
    root: Path


def _mount_tmpfs(where: Path) -> bool:
    """Mount a 2 MiB tmpfs at ``where``; False where that is not permitted (non-root CI)."""
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _umount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True, timeout=30).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


@pytest.fixture(params=["tmpfs", "rlimit"])
def disk(request, tmp_path) -> Iterator[DiskSetup]:
    """A disk to fill: a real tmpfs (falls back to RLIMIT_FSIZE where mount is not permitted),
    or RLIMIT_FSIZE in a child process."""
    root = tmp_path / "disk"
    root.mkdir()
    if request.param == "tmpfs" and _mount_tmpfs(root):
        try:
            yield DiskSetup("tmpfs", root)
        finally:
            _umount(root)
    else:
        yield DiskSetup("rlimit", root)


def _run(disk: DiskSetup, tmp_path: Path, *specs: dict) -> list[Outcome]:
    """run_full_disk(**spec) for each spec, here (tmpfs) or in one child process whose file size
    limit is lowered; each spec names its out_dir."""
    if disk.kind == "tmpfs":
        return [run_full_disk(disk=TmpfsDisk(str(disk.root)), **spec) for spec in specs]
    spec_file, result = tmp_path / "specs.json", tmp_path / "outcomes.pkl"
    spec_file.write_text(json.dumps(specs))
    command = [sys.executable, "-m", "tests.support.fault_training", str(spec_file), str(result)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(result, "rb") as f:
        return [Outcome(**fields) for fields in pickle.load(f)]


REQUIRED = (LOSS, "Sequential_0.weight", "gradient/Sequential_2.weight")


def _check_trial(out_dir: str, outcome: Outcome, required: tuple[str, ...] = REQUIRED) -> list[int]:
    """Everything a reader sees is whole and equal to what training computed; returns the
    readable steps."""
    leftovers = [os.path.join(d, n) for d, _, names in os.walk(out_dir) for n in names
                 if n.startswith(".") or n.endswith(".tmp")]
    assert not leftovers, f"half-written files left behind: {leftovers}"
    trial = create_trial(out_dir)
    steps = trial.steps()
    assert trial.loaded_all_steps  # the end marker made it: the trial says training ended
    saved = set(trial.tensor_names())
    assert set(required) <= saved
    for step in steps:
        for name, by_step in outcome.captured.items():
            if name in saved and step in by_step:
                got, expected = trial.tensor(name).value(step), by_step[step]
                assert got.size == expected.size, (name, step)
                assert np.array_equal(got.reshape(-1), expected.reshape(-1)), (name, step)
    return steps


def _errors(outcome: Outcome, logger: str) -> list[str]:
    return [message for name, message in outcome.errors if name == logger]


def test_full_disk_training_goes_on_and_earlier_steps_stay_readable(disk, tmp_path):
    (outcome,) = _run(disk, tmp_path, {"out_dir": str(disk.root / "run")})
    total = BEFORE + DURING + AFTER
    assert outcome.raised is None and outcome.steps_done == total  # training finished every step
    steps = _check_trial(str(disk.root / "run"), outcome)
    # The step open when the disk filled is the first loss; every step before it is there, and
    # mltrace kept trying: the step written after the disk got space again and all later ones.
    lost_before = [s for s in range(BEFORE - 1) if s not in steps]
    assert not lost_before
    assert steps == list(range(BEFORE - 1)) + list(range(BEFORE + DURING - 1, total))
    # One error when the disk filled, naming the file and the cause, one summary at close.
    errors = _errors(outcome, "mltrace.writer")
    assert len(errors) == 2 and len(outcome.errors) == 2, outcome.errors
    assert FIRST_LOST in errors[0] and any(c in errors[0] for c in DISK_FULL_CAUSES), errors[0]
    assert f"{outcome.write_failures} files of" in errors[1] and outcome.write_failures >= DURING
    _account(completed=outcome.steps_done, expected=total, lost=len(lost_before),
             refused=outcome.write_failures)


def _tensorboard_losses(folder: Path) -> dict[int, float]:
    """Loss scalars by step of the one events file in ``folder``, every record checked whole."""
    (path,) = glob.glob(str(folder / "events.out.tfevents.*"))
    with open(path, "rb") as f:
        records = list(iter_records(f.read(), path, check_data="real"))  # raises if one is partial
    assert records
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    histogram_steps = [e.step for e in acc.Histograms("weights/Sequential_0.weight")]
    losses = {e.step: e.value for e in acc.Scalars(LOSS)}
    assert histogram_steps == sorted(losses)
    return losses


def test_tensorboard_export_on_a_full_disk(disk, tmp_path):
    (outcome,) = _run(disk, tmp_path, {"out_dir": str(disk.root / "run"),
                                       "export_tensorboard": True})
    total = BEFORE + DURING + AFTER
    assert outcome.raised is None and outcome.steps_done == total
    _check_trial(str(disk.root / "run"), outcome)
    losses = _tensorboard_losses(disk.root / "run" / "tensorboard" / "TRAIN")
    # Summaries flushed before the disk filled stay; the flush that failed is dropped whole (the
    # file is cut back to its last whole record) and the next flush appends again.
    expected_steps = list(range(BEFORE)) + list(range(BEFORE + DURING, total))
    assert sorted(losses) == expected_steps
    for step, value in losses.items():
        assert value == float(np.float32(outcome.captured[LOSS][step]))
    errors = _errors(outcome, "mltrace.writer.tensorboard")
    assert outcome.tensorboard_failures >= 1
    assert len(errors) == 1 + (outcome.tensorboard_failures > 1), errors
    assert "tensorboard/TRAIN/events.out.tfevents." in errors[0]
    assert any(c in errors[0] for c in DISK_FULL_CAUSES), errors[0]
    assert len(_errors(outcome, "mltrace.writer")) == 2
    assert len(outcome.errors) == len(errors) + 2, outcome.errors
    _account(completed=outcome.steps_done, expected=total,
             refused=outcome.write_failures + outcome.tensorboard_failures)


def test_full_disk_with_strict_raises_in_training_or_at_close(disk, tmp_path):
    outcome, at_close, export = _run(
        disk, tmp_path, {"out_dir": str(disk.root / "run"), "strict": True},
        {"out_dir": str(disk.root / "run2"), "strict": True, "fault_at_close": True},
        # Only the TensorBoard export on the full disk (the trial's files stay small, elsewhere).
        {"out_dir": str(tmp_path / "run3"), "tensorboard_dir": str(disk.root / "tb"),
         "strict": True, "raw_weights": False})
    assert outcome.raised is not None, "strict=True: training must get the write failure"
    kind, message, location = outcome.raised
    assert kind == "TrialWriteError" and location.endswith(FIRST_LOST), outcome.raised
    assert any(c in message for c in DISK_FULL_CAUSES), message
    # From the next step boundary after the background write failed (a step or two later: a
    # strict hook hands each step to the writer process at once, not in batches).
    assert outcome.raised_at is not None and BEFORE < outcome.raised_at < BEFORE + DURING
    steps = _check_trial(str(disk.root / "run"), outcome)
    assert steps[:BEFORE - 1] == list(range(BEFORE - 1))
    _account(refused=outcome.write_failures)

    assert at_close.steps_done == BEFORE and at_close.raised_at is None  # raised by close()
    kind, message, location = at_close.raised
    assert kind == "TrialWriteError" and location.endswith(FIRST_LOST), at_close.raised
    assert _check_trial(str(disk.root / "run2"), at_close) == list(range(BEFORE - 1))
    _account(refused=at_close.write_failures)

    # The export's flush failed just before the disk got space again: the next step raises.
    assert export.raised_at == BEFORE + DURING and export.write_failures == 0
    kind, message, location = export.raised
    assert kind == "TrialWriteError" and "tb/TRAIN/events.out.tfevents." in location, export.raised
    assert any(c in message for c in DISK_FULL_CAUSES), message
    steps = _check_trial(str(tmp_path / "run3"), export, required=(LOSS,))
    assert steps == list(range(BEFORE + DURING))  # the trial itself never failed
    assert sorted(_tensorboard_losses(disk.root / "tb" / "TRAIN")) == list(range(BEFORE))
    _account(refused=export.tensorboard_failures)


# -- S3 outage: spilling is not an error; a spill on a full disk is ------------------------------
@pytest.fixture(scope="module")
def restartable_s3(tmp_path_factory) -> Iterator[RestartableS3]:
    server = RestartableS3(str(tmp_path_factory.mktemp("weed")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_uri(restartable_s3, monkeypatch) -> Iterator[str]:
    """s3://<new bucket>/run on the restartable server; the server runs again after the test."""
    server = restartable_s3.server
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"f{uuid.uuid4().hex[:12]}"
    server.client().create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/run"
    if restartable_s3.proc is None:
        restartable_s3.start()


def _s3_hook(uri: str, model: nn.Module, **kwargs) -> smd.Hook:
    hook = smd.Hook(out_dir=uri, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"], **kwargs)
    hook.register_module(model)
    return hook


def test_s3_outage_with_strict_spills_and_never_raises(restartable_s3, s3_uri, tmp_path,
                                                        monkeypatch, caplog):
    monkeypatch.setenv("MLTRACE_SPILL_DIR", str(tmp_path / "spill"))
    model, captured = make_model(), Captured()
    hook = _s3_hook(s3_uri, model, strict=True)
    train(model, hook, 3, captured=captured)
    restartable_s3.stop()
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        train(model, hook, 10, captured=captured, start=3)  # strict, and still no exception
        restartable_s3.start()
        train(model, hook, 2, captured=captured, start=13)
        hook.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("answers again" in r.getMessage() for r in caplog.records)
    trial = create_trial(s3_uri)
    assert trial.steps() == list(range(15)) and trial.loaded_all_steps
    for step in trial.steps():
        assert np.array_equal(trial.tensor("gradient/Sequential_0.weight").value(step),
                              captured.values["gradient/Sequential_0.weight"][step])
    _account(completed=15, expected=15)


def test_s3_outage_with_the_spill_on_a_full_disk(restartable_s3, s3_uri, tmp_path, monkeypatch,
                                                  caplog):
    spill_disk = tmp_path / "spill-disk"
    spill_disk.mkdir()
    mounted = _mount_tmpfs(spill_disk)
    if mounted:
        spill_root, filler = spill_disk / "spill", TmpfsDisk(str(spill_disk), slack=0)
    else:  # no tmpfs: a spill folder below a regular file, which the kernel refuses (ENOTDIR)
        (spill_disk / "file").write_text("")
        spill_root, filler = spill_disk / "file" / "spill", None
    monkeypatch.setenv("MLTRACE_SPILL_DIR", str(spill_root))
    try:
        model, captured = make_model(), Captured()
        hook = _s3_hook(s3_uri, model)
        train(model, hook, 3, captured=captured)
        hook.writer.flush()
        if filler is not None:
            filler.fill()
        restartable_s3.stop()
        with caplog.at_level(logging.ERROR, logger="mltrace"):
            train(model, hook, 8, captured=captured, start=3)  # nowhere to write: training goes on
            hook.writer.flush()
            restartable_s3.start()
            train(model, hook, 4, captured=captured, start=11)
            hook.close()
    finally:
        if mounted:
            _umount(spill_disk)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2, errors  # the first lost file, and the summary at close
    assert "nor spill it to" in errors[0] and str(spill_root) in errors[0]
    trial = create_trial(s3_uri)
    steps = trial.steps()
    # Step 2 was open when both went down (its files go at step 3): the first one lost.
    assert steps[:2] == [0, 1] and steps[-3:] == [12, 13, 14] and trial.loaded_all_steps
    for step in steps:  # what is there is whole: no index names an events file that is not there
        assert np.array_equal(trial.tensor("Sequential_0.weight").value(step),
                              captured.values["Sequential_0.weight"][step])
    _account(faults=2, completed=15, expected=15, refused=int(errors[1].split(" ", 1)[0]))


# -- sinks ---------------------------------------------------------------------------------------
def _sqlite_store(tmp_path: Path, template: str) -> str:
    """A tracking URI of a SQLite store in its own folder (which the test removes mid-run)."""
    store = tmp_path / "store"
    store.mkdir()
    shutil.copyfile(template, store / "mlflow.db")
    with sqlite3.connect(store / "mlflow.db") as conn:
        conn.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                     (str(store / "mlruns" / "0"),))
    return f"sqlite:///{store / 'mlflow.db'}"


def _train_with_scalars(hook: smd.Hook, model: nn.Module, loss_fn: nn.Module, steps: range,
                        captured: Captured) -> None:
    for step in steps:
        train(model, hook, 1, captured=captured, loss_fn=loss_fn, start=step)
        hook.save_scalar("accuracy", step / 10)


def _wait_for(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("strict", [False, True])
def test_mlflow_store_that_disappears_mid_run(tracking, mlflow_template_db,
                                              tmp_path, caplog, strict):
    uri = _sqlite_store(tmp_path, mlflow_template_db)
    model, loss_fn, captured = make_model(), nn.MSELoss(), Captured()
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), save_config=smd.SaveConfig(save_interval=1),
                    strict=strict, include_collections=["weights", "losses"],
                    mlflow={"tracking_uri": uri, "flush_interval": 0.05, "logging_process": False})
    hook.register_module(model)
    hook.register_loss(loss_fn)
    sink = hook.sinks[0]
    _train_with_scalars(hook, model, loss_fn, range(3), captured)
    _wait_for(lambda: sink.metrics_sent >= 6)
    shutil.rmtree(tmp_path / "store")  # the store goes away: SQLite can no longer write
    raised = None
    with caplog.at_level(logging.ERROR):
        try:
            for step in range(3, 12):
                _train_with_scalars(hook, model, loss_fn, range(step, step + 1), captured)
                time.sleep(0.02)  # a batch goes out now and then, as in a real run
        except Exception as exc:
            raised = exc
        try:
            hook.close()
        except Exception as exc:
            raised = raised or exc
    # MLflow's SQL store logs each failed call itself (mlflow.store.db.utils; in the default helper
    # process that goes nowhere): only mltrace's own records count here.
    errors = [r for r in caplog.records
              if r.levelno >= logging.ERROR and r.name.startswith(("mltrace", "mltrace_mlflow"))]
    if strict:
        assert raised is not None and "readonly database" in str(raised)
        assert sink.run_id in str(raised)
        _account()
        return
    assert raised is None
    first = [r.getMessage() for r in errors if "could not log metrics" in r.getMessage()]
    assert len(first) == 1 and "readonly database" in first[0]
    assert not [r for r in errors if r.name == "mltrace" or r.name.startswith("mltrace.")]  # the trial never failed
    assert len(errors) <= 2, [r.getMessage() for r in errors]  # plus at most the close summary
    trial = create_trial(str(tmp_path / "trial"))
    assert trial.steps() == list(range(12))
    for step in trial.steps():
        assert np.array_equal(trial.tensor("Sequential_0.weight").value(step),
                              captured.values["Sequential_0.weight"][step])
    _account(completed=12, expected=12)


class PipeSink:
    """A custom sink: metric lines to a process that reads them (a live dashboard, say)."""

    def __init__(self, reader: subprocess.Popen) -> None:
        self.stream = reader.stdin

    def log_scalar(self, name: str, value: float, mode: object, mode_step: int) -> None:
        self.stream.write(f"{mode_step} {name} {value}\n")
        self.stream.flush()

    def close(self) -> None:
        try:
            self.stream.close()
        except BrokenPipeError:  # the reader left; nothing to flush to
            pass


@pytest.mark.parametrize("strict", [False, True])
def test_a_sink_that_raises_never_stops_saving(tmp_path, caplog, strict):
    reader = subprocess.Popen(["head", "-n", "4"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              text=True)
    model, loss_fn, captured = make_model(), nn.MSELoss(), Captured()
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), save_config=smd.SaveConfig(save_interval=1),
                    strict=strict, include_collections=["weights", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.sinks.append(PipeSink(reader))
    _train_with_scalars(hook, model, loss_fn, range(2), captured)  # 4 lines: the reader exits
    reader.wait(timeout=30)
    with caplog.at_level(logging.ERROR, logger="mltrace"):
        if strict:
            with pytest.raises(BrokenPipeError):
                _train_with_scalars(hook, model, loss_fn, range(2, 8), captured)
            hook.close()
            _account()
            return
        _train_with_scalars(hook, model, loss_fn, range(2, 8), captured)
        hook.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and "BrokenPipeError" in errors[0], errors
    assert "failed 12 times" in errors[1]  # 6 steps x (loss + accuracy)
    trial = create_trial(str(tmp_path / "trial"))
    assert trial.steps() == list(range(8))
    accuracy = trial.tensor("scalar/accuracy")
    assert [accuracy.value(s).item() for s in range(8)] == [s / 10 for s in range(8)]
    _account(completed=8, expected=8)


# -- the hook's own code path --------------------------------------------------------------------
@pytest.mark.parametrize("strict", [False, True])
def test_a_tensor_the_encoder_cannot_handle(tmp_path, caplog, strict):
    """torch dtypes numpy lacks (quantized, float8) once disabled the whole hook."""
    model, captured = make_model(), Captured()
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), save_config=smd.SaveConfig(save_interval=1),
                    strict=strict, include_collections=["weights", "odd"])
    hook.get_collection("odd").include("^odd")
    hook.register_module(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates quantized tensors
        odd = [torch.randn(3).to(torch.float8_e4m3fn),
               torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)]
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        for step in range(4):
            train(model, hook, 1, captured=captured, start=step)
            if strict:
                with pytest.raises(TypeError, match="float8_e4m3fn"):
                    hook.record_tensor_value("odd_fp8", odd[0])
                hook.close()
                _account()
                return
            hook.record_tensor_value("odd_fp8", odd[0])
            hook.record_tensor_value("odd_q", odd[1])
        hook.close()
    assert not hook.disabled
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2, warned  # once per tensor, not per step
    assert all("not saving tensor" in m for m in warned), warned
    trial = create_trial(str(tmp_path / "trial"))
    assert trial.steps() == list(range(4))
    for step in range(4):
        assert np.array_equal(trial.tensor("Sequential_0.weight").value(step),
                              captured.values["Sequential_0.weight"][step])
    _account(faults=2, completed=4, expected=4)
