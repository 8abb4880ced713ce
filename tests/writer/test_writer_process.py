"""The trial writer's process (mltrace.writer.process): a local trial's files are written by a
child process fed through a pipe. It writes the same files as the thread, in the same order and
groups; failures come back to the writer's failure log; a child that cannot start or dies hands
its work to the thread; a child whose training process is killed still writes what it got."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mltrace.collections import CollectionManager
from mltrace.format import paths
from mltrace.modes import ModeKeys
from mltrace.storage import atomic_files
from mltrace.storage.local import LocalStorage
from mltrace.trials import create_trial
from mltrace.writer import TrialWriter
from mltrace.writer import process as writer_process

ROOT = Path(__file__).resolve().parents[2]


def _write_steps(writer: TrialWriter, steps: range, size: int = 3) -> None:
    for step in steps:
        writer.open_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("x", np.full(size, float(step)), ModeKeys.TRAIN, step, wall_time=1.0)
        writer.close_step()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _kill_child_and_write_on(writer: TrialWriter, process: writer_process.WriterProcess,
                             steps: range) -> None:
    """SIGKILL the writer's child, write ``steps`` and close: the thread takes over, and the
    death is the one recorded failure."""
    os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not process.gone and time.monotonic() < deadline:
        time.sleep(0.01)
    _write_steps(writer, steps)
    writer.write_end_marker()
    writer.close()
    assert writer._process is None  # noqa: SLF001 - the thread took over
    (message,) = writer.failures.messages
    assert f"writer process {process.pid} exited with status -9" in message


def test_the_process_writes_the_files_the_thread_writes(tmp_path, monkeypatch):
    trials = {}
    for kind in ("process", "thread"):
        monkeypatch.setenv(writer_process.WRITER_ENV, kind)
        writer = TrialWriter(LocalStorage(str(tmp_path / kind)), "worker_0")
        assert (writer._process is not None) == (kind == "process")  # noqa: SLF001
        writer.write_collections(CollectionManager().to_json())
        _write_steps(writer, range(30))
        writer.write_end_marker()
        writer.close()
        assert writer.failures.messages == []
        trials[kind] = _files(tmp_path / kind)
    assert trials["process"] == trials["thread"] and len(trials["process"]) == 63
    assert create_trial(str(tmp_path / "process")).steps() == list(range(30))


def test_files_reach_the_disk_without_a_flush_when_training_stops_saving(tmp_path):
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    _write_steps(writer, range(3))  # fewer than a batch: the reports thread sends them
    index = tmp_path / "run" / paths.index_file_key(2, "worker_0")
    deadline = time.monotonic() + 10
    while not index.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert index.exists()
    writer.close()


def test_a_hooked_trainings_saved_steps_are_handed_over_when_saving_stops(tmp_path):
    """A TRAIN save config of steps 10-14 and twenty steps trained, the writer process ready:
    when step 15 begins (it saves nothing), steps 10-14 are in the child's hands, none waits in
    a batch for a timer, and a reader in the same process lists all five while training goes
    on, without close() (README, "When a saved step can be read"). Reading is polled for at
    most a second: the child writes on its own time."""
    import torch

    import mltrace.pytorch as smd

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    out = str(tmp_path / "run")
    saved = list(range(10, 15))
    hook = smd.Hook(out_dir=out, include_collections=["weights", "gradients"],
                    save_config=smd.SaveConfig(mode_save_configs={
                        smd.modes.TRAIN: smd.SaveConfigMode(save_steps=saved)}))
    hook.register_module(model)
    hook.set_mode(smd.modes.TRAIN)
    waiting = []
    for step in range(20):
        model(torch.randn(2, 4)).sum().backward()
        if step == 0:
            time.sleep(0.5)  # the writer process is ready: steps go through its batches
        waiting.append(hook.writer.steps_waiting)
    assert max(waiting[10:15]) > 0  # saved steps in quick succession are batched
    assert waiting[15:] == [0] * 5  # from step 15 on, nothing waits to be batched
    deadline = time.monotonic() + 1.0
    trial = create_trial(out)
    while not set(saved) <= set(trial.steps()) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert set(saved) <= set(trial.steps())
    hook.close()


def test_a_file_the_child_cannot_write_is_reported_and_its_step_has_no_index(tmp_path, caplog):
    root = tmp_path / "run"
    root.mkdir()
    (root / "events").write_bytes(b"not a folder")  # every events file fails (ENOTDIR)
    writer = TrialWriter(LocalStorage(str(root)), "worker_0")
    assert writer._process is not None  # noqa: SLF001
    writer.write_collections(CollectionManager().to_json())
    _write_steps(writer, range(4))
    writer.flush()
    assert writer.failures.count == 4  # each step's events file; no index file was tried
    first = writer.failures.messages[0]
    assert paths.event_file_key(0, "worker_0") in first and "Not a directory" in first, first
    writer.close()
    assert not (root / "index").exists()  # no index names an events file that is not there
    assert (root / paths.collections_file_key("worker_0")).exists()
    assert "4 files of" in caplog.text  # close sums them up: each step's events file


def test_strict_writers_get_the_childs_failure_as_their_own(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / "events").write_bytes(b"")
    writer = TrialWriter(LocalStorage(str(root)), "worker_0")
    _write_steps(writer, range(1))
    writer.flush()
    failure = writer.failures.take()
    assert failure is not None and isinstance(failure.cause, NotADirectoryError)
    assert failure.location.endswith(paths.event_file_key(0, "worker_0"))
    writer.close()


def test_a_child_that_never_starts_leaves_every_file_to_the_thread(tmp_path, monkeypatch):
    broken = tmp_path / "broken_child.py"
    broken.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(writer_process, "CHILD_PROGRAM", str(broken))
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    assert writer._process is not None  # noqa: SLF001 - started; it exits before it is ready
    writer.write_collections(CollectionManager().to_json())  # written here: the child is not ready
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the child exits; the next file notices (or this one did)
        process = writer._process  # noqa: SLF001
        if process is None or process.gone:
            break
        time.sleep(0.01)
    _write_steps(writer, range(12))
    assert writer._process is None and writer._thread is not None  # noqa: SLF001 - the thread took over
    writer.write_end_marker()
    writer.close()
    assert writer.failures.messages == []
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == list(range(12)) and trial.loaded_all_steps


def test_a_child_killed_mid_run_is_a_recorded_failure_and_the_thread_goes_on(tmp_path):
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    writer.write_collections(CollectionManager().to_json())
    _write_steps(writer, range(5))
    writer.flush()
    process = writer._process  # noqa: SLF001
    assert process is not None
    _kill_child_and_write_on(writer, process, range(5, 10))
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == list(range(10))  # nothing was held when it died: nothing lost


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM to the process group"])
def test_the_child_writes_what_it_got_after_the_training_process_is_killed(tmp_path, how):
    """Large steps go to the child at once (a batch is full); the parent then dies (SIGKILL, or
    a scheduler's SIGTERM to the whole process group, which the child ignores) with the child
    still writing: every step it got is written whole."""
    root = tmp_path / "run"
    kill = ("os.kill(os.getpid(), signal.SIGKILL)" if how == "SIGKILL"
            else "os.killpg(os.getpgid(0), signal.SIGTERM)")
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        from mltrace.modes import ModeKeys
        from mltrace.storage.local import LocalStorage
        from mltrace.writer import TrialWriter
        from mltrace.collections import CollectionManager
        writer = TrialWriter(LocalStorage({str(root)!r}), "worker_0")
        writer.write_collections(CollectionManager().to_json())
        print(writer._process.pid, flush=True)
        for step in range(12):
            writer.open_step(step, ModeKeys.TRAIN, step)
            writer.add_tensor("x", np.full(1 << 20, float(step)), ModeKeys.TRAIN, step)
            writer.close_step()
        {kill}
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          start_new_session=True)  # its own process group, for killpg
    assert done.returncode == -(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM), done.stderr
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    trial = create_trial(str(root))
    assert trial.steps() == list(range(12))
    assert all(trial.tensor("x").value(s)[-1] == s for s in range(12))


def test_a_step_larger_than_the_pipe_does_not_wait_for_the_child_to_read_it(tmp_path):
    """A save step of a big model (here 3 MiB, three times the pipe) is sent by the reports
    thread as the child reads: with the child stopped (SIGSTOP), handing two of them over still
    returns. A third would pass PUSH_BYTES unsent: that one waits until the child reads again.
    Then flush waits for all of them, and every step is on disk, in order."""
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    writer.write_collections(CollectionManager().to_json())
    process = writer._process  # noqa: SLF001
    assert process is not None
    writer.flush()  # the child is ready: files go to it from now on
    channel = process._channel  # noqa: SLF001
    third = threading.Thread(target=_write_steps, args=(writer, range(2, 3), 3 << 17))
    os.kill(process.pid, signal.SIGSTOP)
    try:
        first = threading.Thread(target=_write_steps, args=(writer, range(2), 3 << 17))
        first.start()
        first.join(10)
        assert not first.is_alive(), "handing over waited for a child that reads nothing now"
        assert channel.pushing and channel.parts, "the rest waits for the reports thread"
        third.start()
        third.join(0.5)
        assert third.is_alive(), "past PUSH_BYTES unsent, handing a step over waits"
    finally:
        os.kill(process.pid, signal.SIGCONT)
    third.join(30)
    assert not third.is_alive()
    writer.flush()
    assert not channel.pushing and not channel.parts
    writer.write_end_marker()
    writer.close()
    assert writer.failures.messages == []
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2]
    for step in range(3):
        assert (trial.tensor("x").value(step) == float(step)).all()


def test_a_child_that_dies_holding_unsent_steps_leaves_them_to_the_thread(tmp_path):
    """Steps left for the reports thread to push (the child stopped, then killed) are not lost
    when the child dies: the thread writes them, from their parts as the pipe would have taken
    them, and the death is a recorded failure."""
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    writer.write_collections(CollectionManager().to_json())
    process = writer._process  # noqa: SLF001
    assert process is not None
    writer.flush()
    os.kill(process.pid, signal.SIGSTOP)
    _write_steps(writer, range(2), size=3 << 17)  # 3 MiB each: left for the reports thread
    assert process._channel.groups  # noqa: SLF001 - not in the pipe, or not whole
    _kill_child_and_write_on(writer, process, range(2, 4))
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3]
    for step in range(4):
        assert (trial.tensor("x").value(step) == float(step)).all()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_forked_copy_of_the_writer_leaves_the_parents_child_alone(tmp_path):
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    writer.write_collections(CollectionManager().to_json())
    _write_steps(writer, range(3))
    writer.flush()
    pid = os.fork()
    if pid == 0:  # the copy: its writer's process is the parent's; it closes nothing of it
        try:
            code = 0 if writer._process is not None and writer._process.gone else 1  # noqa: SLF001
            writer._process.close()  # noqa: SLF001
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    _write_steps(writer, range(3, 6))
    writer.close()
    assert writer.failures.messages == []
    assert create_trial(str(tmp_path / "run")).steps() == list(range(6))


def test_an_unknown_writer_choice_is_named_and_the_process_is_used(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(writer_process.WRITER_ENV, "threads")
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    assert writer._process is not None  # noqa: SLF001
    writer.close()
    assert "MLTRACE_WRITER='threads' is not a writer: use 'process' or 'thread'" in caplog.text


def test_storages_that_write_their_own_way_keep_the_thread(tmp_path):
    class Counting(LocalStorage):
        def write(self, key: str, data: bytes) -> None:
            super().write(key, data)

    writer = TrialWriter(Counting(str(tmp_path / "run")), "worker_0")
    assert writer._process is None  # noqa: SLF001
    writer.close()


@pytest.mark.parametrize("folders", [10, 3 * atomic_files.MADE_DIRS_KEPT])
def test_atomic_files_remember_a_bounded_number_of_folders(tmp_path, folders):
    files = atomic_files.AtomicFiles()
    for i in range(folders):
        files.write(str(tmp_path / f"{i:04d}" / "f"), b"x")
        assert len(files.made_dirs) <= atomic_files.MADE_DIRS_KEPT
    assert sorted(os.listdir(tmp_path)) == [f"{i:04d}" for i in range(folders)]
