"""Crash safety: training processes killed with SIGKILL at random moments leave trials that open
and serve every step whose files exist, each value exact; a reader beside them never fails.

One fork server (tests/support/crash_training.py) imports torch once and forks a training process per run,
so dozens of kills fit in well under a minute. Each run writes its own out_dir while a live reader
(create_trial on the same out_dir, refreshing) reads every value of every step as it appears; the
test kills the run after a seeded random delay (a third of them within the first steps), or the
child kills itself right after one chosen file is in place. Some runs are restarted into the same
out_dir after the kill (the hook accepts an out_dir without the end marker and rewrites its steps
from step 0) and killed again. After the kills, a fresh trial must serve exactly the steps whose
index file exists, every value equal to an unkilled reference run's (and the step-derived values
equal to their formula), and ignore the temp files that kills left. The figures are printed
(``pytest -s``) for docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import pytest

from mltrace.collections import CollectionManager
from mltrace.exceptions import MissingCollectionFiles, StepNotYetAvailable, StepUnavailable
from mltrace.format import paths
from mltrace.modes import ModeKeys
from mltrace.storage.base import Storage
from mltrace.storage.local import LocalStorage
from mltrace.trials import Trial, create_trial
from mltrace.writer import TrialWriter
from tests.support.crash_training import expected_custom, is_eval_step
from tests.support.processes import wait_for_writers
from tests.support.servers import stop

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 300  # more than any run reaches before its kill
RANDOM_RUNS, RESTARTED_RUNS, TARGETED_RESTARTS, TARGETED_RUNS = 14, 4, 3, 2
EARLY_DELAY = 0.25  # seconds after the fork: the hook starts, the first steps are written
MAX_DELAY = 1.5  # at most, and at most 60% of an unkilled run's time, so kills land before its end
Digest = tuple[str, tuple[int, ...], bytes]


def _digest(value: np.ndarray) -> Digest:
    """dtype, shape and a hash of the bytes: equal digests mean bitwise equal values."""
    digest = hashlib.blake2b(value.tobytes(), digest_size=16).digest()
    return value.dtype.str, tuple(value.shape), digest


@dataclass
class StepData:
    """Everything a trial serves for one global step."""

    mode: ModeKeys
    mode_step: int
    values: dict[str, Digest]
    reductions: dict[tuple[str, str, bool], Digest]

    def count(self) -> int:
        return len(self.values) + len(self.reductions)


def read_step(trial: Trial, step: int) -> StepData:
    """Read every value and stored reduction of ``step`` (raises whatever the reader raises)."""
    mode, mode_step = trial.mode_modestep(step)
    values, reductions = {}, {}
    for name in trial.tensor_names(step=step):
        tensor = trial.tensor(name)  # every tensor of this training saves its raw value
        values[name] = _digest(tensor.value(step))
        for (red, abs_), value in tensor.reduction_values(step).items():
            reductions[(name, red, abs_)] = _digest(value)
    assert mode is not None and mode_step is not None, step
    return StepData(mode, mode_step, values, reductions)


@dataclass
class Figures:
    """What the test counts, printed at the end for docs/reliability.md."""

    kills: int = 0
    random_kills: int = 0
    runs: int = 0
    restarts: int = 0
    steps_checked: int = 0
    values_checked: int = 0
    live_steps: int = 0
    live_values: int = 0
    temp_files_left: int = 0
    temp_files_planted: int = 0
    empty_trials: int = 0
    orphan_events: int = 0
    finished_before_kill: int = 0
    writers_outlived_kill: int = 0
    lost: list[str] = field(default_factory=list)

    def line(self, seconds: float) -> str:
        return (f"CRASH-SIGKILL: kills={self.kills} (random delay {self.random_kills}, at a chosen "
                f"file {self.kills - self.random_kills}) runs={self.runs} restarts={self.restarts} "
                f"steps_checked={self.steps_checked} values_checked={self.values_checked} "
                f"live_steps_read={self.live_steps} live_values_read={self.live_values} "
                f"temp_files_left_by_kills={self.temp_files_left} temp_files_planted="
                f"{self.temp_files_planted} orphan_events_files="
                f"{self.orphan_events} killed_before_first_step={self.empty_trials} "
                f"finished_before_kill={self.finished_before_kill} "
                f"writers_outlived_kill={self.writers_outlived_kill} "
                f"steps_lost={len(self.lost)} seconds={seconds:.1f}")


class ForkServer:
    """The client side of tests/support/crash_training.py's protocol."""

    def __init__(self, log_path: str) -> None:
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.crash_training"], cwd=REPO, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True)
        self._reply(timeout=60)  # {"ready": pid} once torch is imported

    def _reply(self, timeout: float = 30) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"fork server silent for {timeout} s; see {self.log.name}"
        line = self.proc.stdout.readline()
        assert line, f"fork server exited ({self.proc.poll()}); see {self.log.name}"
        return json.loads(line)

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def run(self, out_dir: str, die_after: str | None = None) -> int:
        """Fork a training child into ``out_dir``; its PID."""
        return self._ask({"run": out_dir, "steps": STEPS, "die_after": die_after})["pid"]

    def reap(self, pid: int) -> int:
        """Wait for a child; its status (-9 after SIGKILL, 0 if it finished)."""
        return self._ask({"reap": pid})["status"]

    def close(self) -> None:
        stop(self.proc)
        self.log.close()


@dataclass
class Harness:
    """What every run of the test shares."""

    server: ForkServer
    reference: dict[int, StepData]
    max_delay: float
    rng: random.Random
    figures: Figures = field(default_factory=Figures)


def load_reference(server: ForkServer, out_dir: str) -> tuple[dict[int, StepData], float]:
    """Run the training once without a kill and read it: the expected data of every step, and
    the seconds the run took."""
    started = time.monotonic()
    assert server.reap(server.run(out_dir)) == 0
    seconds = time.monotonic() - started
    trial = create_trial(out_dir)
    reference = {step: read_step(trial, step) for step in trial.steps()}
    assert sorted(reference) == list(range(STEPS))
    train_steps = eval_steps = 0
    for step, data in reference.items():  # the reference itself must hold what the child saved
        for name, value in expected_custom(step).items():
            assert data.values[name] == _digest(value), (step, name)
        evaluating = is_eval_step(step)
        assert (data.mode, data.mode_step) == ((ModeKeys.EVAL, eval_steps) if evaluating
                                               else (ModeKeys.TRAIN, train_steps)), step
        eval_steps, train_steps = eval_steps + evaluating, train_steps + (not evaluating)
    shutil.rmtree(out_dir)
    return reference, seconds


class LiveReader:
    """A reader beside the training process: opens the trial as soon as it exists and reads every
    value of every step once it appears. Any exception from the reader fails the test."""

    def __init__(self, out_dir: str, reference: dict[int, StepData], figures: Figures) -> None:
        self.out_dir, self.reference, self.figures = out_dir, reference, figures
        self.trial: Trial | None = None
        self.seen: set[int] = set()
        #: True once a second job writes this out_dir (see _check and drain)
        self.restarted = False

    def poll(self) -> bool:
        """Read at most one new step; False if there was none."""
        if self.trial is None:
            try:
                self.trial = create_trial(self.out_dir, timeout=0)
            except MissingCollectionFiles:
                return False
        new = [s for s in self.trial.steps() if s not in self.seen]
        if not new:
            return False
        self._check(new[0])
        return True

    def _check(self, step: int) -> None:
        try:
            data = read_step(self.trial, step)
        except (StepUnavailable, StepNotYetAvailable):
            # A restarted job removes an old step's index before replacing its events file (see
            # drain): that step may vanish between the listing and the read, and only then. It
            # is read again if the job writes it anew.
            assert self.restarted and step not in self.trial.steps(), (self.out_dir, step)
            return
        assert data == self.reference[step], f"live reader: {self.out_dir} step {step} differs"
        self.seen.add(step)
        self.figures.live_steps += 1
        self.figures.live_values += data.count()

    def drain(self, restarted: bool) -> None:
        """After the kill: read what is left, then every step again through the same (long-lived)
        trial, which must still serve each of them exactly, also after a restarted job rewrote
        them. Only a step whose index the restarted job had removed when it died (it removes a
        step's old index before replacing its events file) may differ from the disk: vanished
        from the trial if the job had replaced its events file, or still served (the earlier
        run's values, checked above) from the events file the job had not replaced yet."""
        while self.poll():
            pass
        if self.trial is None:
            return
        on_disk = files_on_disk(self.out_dir)[0]
        for step in self.trial.steps():
            try:
                data = read_step(self.trial, step)
            except (StepUnavailable, StepNotYetAvailable):
                assert step not in on_disk and step not in self.trial.steps(), (self.out_dir, step)
                continue
            assert data == self.reference[step], f"live reader: {self.out_dir} step {step} differs"
        served = set(self.trial.steps())
        assert on_disk <= served, (self.out_dir, sorted(on_disk - served))
        assert len(served - on_disk) <= restarted, (self.out_dir, sorted(served - on_disk))


def run_until(h: Harness, live: LiveReader, delay: float | None,
              die_after: str | None = None) -> bool:
    """Fork one training process, read beside it, and SIGKILL it ``delay`` s after the fork (or
    let it kill itself after writing ``die_after``). True if it died by SIGKILL."""
    server, figures = h.server, h.figures
    pid = server.run(live.out_dir, die_after)
    deadline = time.monotonic() + (delay if delay is not None else 60.0)
    while time.monotonic() < deadline:
        if not live.poll():
            if delay is None and _exited(pid):
                break
            time.sleep(0.003)
    if delay is not None:
        os.kill(pid, 9)  # our grandchild, not yet reaped: the PID is still its own
    status = server.reap(pid)
    assert status in (-9, 0), f"training child exited with {status}; see the fork server log"
    # The killed process's writer process writes what it was handed and then exits; only then
    # does the disk hold what the kill left (and a restarted job starts, as after a real kill).
    figures.writers_outlived_kill += wait_for_writers(live.out_dir)
    figures.kills += status == -9
    figures.random_kills += status == -9 and delay is not None
    figures.finished_before_kill += status == 0
    return status == -9


def _exited(pid: int) -> bool:
    """Whether a (not yet reaped) child of the fork server is a zombie, i.e. has died."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def files_on_disk(out_dir: str) -> tuple[set[int], set[int], int]:
    """(steps with an index file, steps with an events file, temp files), from the directory."""
    index, events, temps = set(), set(), 0
    for folder, _, names in os.walk(out_dir):
        for name in names:
            if name.startswith(".") or name.endswith(".tmp"):
                temps += 1
            elif name.endswith(".json") and os.path.basename(os.path.dirname(folder)) == "index":
                index.add(int(name.split("_", 1)[0]))
            elif name.endswith(".tfevents"):
                events.add(int(name.split("_", 1)[0]))
    return index, events, temps


def plant_leftovers(out_dir: str, step: int) -> None:
    """Half-written temp files of ``step`` named as LocalStorage names them, as a kill during
    their write would leave them: the reader must never take them for data."""
    halves = {paths.event_file_key(step, "worker_0"): b"\x10\x00\x00\x00\x00\x00\x00\x00\x01\x02",
              paths.index_file_key(step, "worker_0"): b'{"meta": {"mode": "TRAIN", "mode_st'}
    for key, data in halves.items():
        folder, name = os.path.split(os.path.join(out_dir, *key.split("/")))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f".{name}.1.2.tmp"), "wb") as f:
            f.write(data)


def check_after_kills(h: Harness, out_dir: str, restarted: bool) -> None:
    """A fresh trial serves exactly the steps whose index file exists, every value exact.

    Steps are written in order, so their index files are steps 0..n-1; after a restart, less
    one at most: the step whose earlier index the restarted job had removed when it died."""
    figures = h.figures
    index, events, temps = files_on_disk(out_dir)
    figures.temp_files_left += temps
    figures.orphan_events += len(events - index)
    holes = set(range(max(index, default=-1) + 1)) - index
    assert len(holes) <= restarted, f"{out_dir}: steps {sorted(holes)} have no index file"
    assert index <= events, f"{out_dir}: an index file without its events file"
    plant_leftovers(out_dir, max(index, default=-1) + 1)
    figures.temp_files_planted += 2
    try:
        trial = create_trial(out_dir, timeout=0)
    except MissingCollectionFiles:
        assert not index, f"{out_dir}: index files but no collections file"
        figures.empty_trials += 1
        return
    figures.empty_trials += not index
    served = set(trial.steps())
    figures.lost += [f"{out_dir} step {s}: not served" for s in sorted(index - served)]
    assert served <= index, f"{out_dir}: steps {sorted(served - index)} served without index files"
    for step in sorted(served):
        try:
            data = read_step(trial, step)
        except Exception as exc:
            figures.lost.append(f"{out_dir} step {step}: {type(exc).__name__}: {exc}")
            continue
        if data != h.reference[step]:
            figures.lost.append(f"{out_dir} step {step}: values differ from the reference")
        figures.steps_checked += 1
        figures.values_checked += data.count()


def _delay(h: Harness, early: bool) -> float:
    """A seeded random kill delay: early ones land while the hook starts or in the first steps."""
    return h.rng.uniform(0.0, EARLY_DELAY) if early else h.rng.uniform(EARLY_DELAY, h.max_delay)


def _schedule(h: Harness) -> list[tuple[str, float]]:
    """(kind, delay) per run, shuffled; a third of the delays are early ones."""
    kinds = (["random"] * RANDOM_RUNS + ["restart"] * RESTARTED_RUNS
             + ["restart-at-file"] * TARGETED_RESTARTS + ["at-file"] * TARGETED_RUNS)
    h.rng.shuffle(kinds)
    return [(kind, _delay(h, early=i % 3 == 0)) for i, kind in enumerate(kinds)]


def _one_run(h: Harness, out_dir: str, kind: str, delay: float) -> None:
    """One out_dir: kill(s) with a live reader beside, then the check of what is left."""
    live, restarts = LiveReader(out_dir, h.reference, h.figures), h.figures.restarts
    if kind == "at-file":  # dies between a step's events file and its index file
        assert run_until(h, live, None, paths.event_file_key(h.rng.randrange(0, 30), "worker_0"))
    elif run_until(h, live, delay) and kind.startswith("restart"):
        h.figures.restarts += 1
        live.restarted = True
        written = sorted(files_on_disk(out_dir)[0])
        if kind == "restart":
            run_until(h, live, _delay(h, early=h.rng.random() < 0.3))
        else:  # the restarted job dies right after rewriting the events file of an old step
            step = h.rng.choice(written) if written else 0
            assert run_until(h, live, None, paths.event_file_key(step, "worker_0"))
    restarted = h.figures.restarts > restarts
    live.drain(restarted)
    check_after_kills(h, out_dir, restarted)
    h.figures.runs += 1


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_every_written_step_readable(tmp_path):
    started = time.monotonic()
    server = ForkServer(str(tmp_path / "fork_server.log"))
    try:
        reference, seconds = load_reference(server, str(tmp_path / "reference"))
        h = Harness(server, reference, min(MAX_DELAY, 0.6 * seconds), random.Random(20240611))
        for i, (kind, delay) in enumerate(_schedule(h)):
            out_dir = str(tmp_path / f"run{i:02d}")
            _one_run(h, out_dir, kind, delay)
            shutil.rmtree(out_dir)  # keep tmp_path small: a run writes up to ~50 MB
    finally:
        server.close()
    print("\n" + h.figures.line(time.monotonic() - started))
    assert not h.figures.lost, "steps lost:\n" + "\n".join(h.figures.lost[:20])
    assert h.figures.kills >= 20 and h.figures.random_kills >= 15, h.figures


# -- the two bugs the test above found, pinned in-process ------------------------------------------
def _refusing(storage_class: type[Storage], refuse: str) -> type[Storage]:
    """``storage_class`` refusing one key (fault injection on the real storage): the writer then
    drops the rest of that step (or keeps it in the spill), leaving the files as a kill right
    before that write would."""

    class Refusing(storage_class):  # type: ignore[valid-type,misc]
        def write(self, key: str, data: bytes) -> None:
            if key == refuse:
                raise OSError(28, "No space left on device (injected)")
            super().write(key, data)

    return Refusing


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.server)])
def location(request, tmp_path, monkeypatch) -> tuple[str, type[Storage]]:
    """(trial URI, its storage class) on local disk and on the S3 server of tests/support/servers.py."""
    if request.param == "local":
        return str(tmp_path / "run"), LocalStorage
    from mltrace.storage.s3 import S3Storage

    server = request.getfixturevalue("s3_server")
    bucket = f"crash{uuid.uuid4().hex[:10]}"
    server.client().create_bucket(Bucket=bucket)
    for key, value in (("AWS_ENDPOINT_URL", server.endpoint),
                       ("AWS_ACCESS_KEY_ID", server.access_key),
                       ("AWS_SECRET_ACCESS_KEY", server.secret_key),
                       ("AWS_DEFAULT_REGION", "us-east-1"),
                       ("MLTRACE_SPILL_DIR", str(tmp_path / "spill"))):
        monkeypatch.setenv(key, value)
    return f"s3://{bucket}/run", S3Storage


def _write(storage: Storage, steps: range, value: float) -> None:
    """Steps of one tensor x = value + step, by a new writer (which looks for an earlier run)."""
    writer = TrialWriter(storage, "worker_0", close_timeout=0.2, retry_interval=0.1)
    writer.write_collections(CollectionManager().to_json())
    for step in steps:
        writer.open_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("x", np.full(3, value + step), ModeKeys.TRAIN, step)
        writer.close_step()
    writer.flush()
    writer.close()  # no end marker: as a crashed run leaves it


def test_a_restarted_job_dying_between_a_steps_two_files_leaves_no_mismatched_index(location):
    uri, storage_class = location
    _write(storage_class(uri), range(3), 0.0)
    dying = _refusing(storage_class, paths.index_file_key(1, "worker_0"))
    _write(dying(uri), range(2), 100.0)
    trial = create_trial(uri, timeout=0)
    assert trial.steps() == [0, 2]  # step 1 is absent, not an index naming the new events file
    assert [trial.tensor("x").value(s)[0] for s in (0, 2)] == [100.0, 2.0]


def test_a_live_trial_reads_the_steps_a_restarted_job_rewrote(tmp_path):
    root = str(tmp_path / "run")
    _write(LocalStorage(root), range(3), 0.0)
    live = create_trial(root, timeout=0)
    assert live.tensor("x").value(0)[0] == 0.0
    _write(_refusing(LocalStorage, paths.index_file_key(1, "worker_0"))(root), range(2), 100.0)
    assert live.tensor("x").value(0)[0] == 100.0  # re-indexed after its record failed the CRC
    with pytest.raises(StepUnavailable):  # being rewritten when the job died: gone for now
        live.tensor("x").value(1)
    assert live.steps() == [0, 2]
    _write(LocalStorage(root), range(2), 200.0)
    assert live.steps() == [0, 1, 2]  # a refresh found step 1's new index
    assert [live.tensor("x").value(s)[0] for s in range(3)] == [200.0, 201.0, 2.0]
