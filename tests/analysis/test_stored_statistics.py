"""The overview's statistics kept on disk (mltrace.analysis.stored): a fresh viewer of a trial read
before decodes nothing, a step rewritten since is read again, and a damaged, foreign or
unwritable cache costs a warning, never a wrong or missing value. Real trials written by
mltrace's writer; each test has a cache folder of its own."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from mltrace.analysis import StatisticCache, tensor_heatmap
from mltrace.analysis import stored as stored_mod
from mltrace.trials import Trial, create_trial
from tests.support.rule_trials import write_trial

STEPS = 12
NAMES = [f"gradient/layer{k}.weight" for k in range(3)]


def _value(k: int, step: int, bump: float = 1.0) -> np.ndarray:
    return np.linspace(-1.0, 1.0, 16, dtype=np.float32) * (k + 1) * (step + 1) * bump


def _write(path: Path, steps: range = range(STEPS), bumped: int | None = None,
           end: bool = True) -> str:
    data = {s: {n: _value(k, s, 10.0 if s == bumped else 1.0) for k, n in enumerate(NAMES)}
            for s in steps}
    # fixed wall times: a step written again with the same values is the same bytes
    return write_trial(path, data, collections={"gradients": ["^gradient/"]}, end=end,
                       wall_times={s: 1e9 + s for s in steps})


def _l2(k: int, step: int, bump: float = 1.0) -> float:
    return float(np.linalg.norm(_value(k, step, bump).astype(np.float64)))


def _highs(trial: Trial, cache: StatisticCache, statistic: str = "l2") -> list[list[float]]:
    found = tensor_heatmap(trial, NAMES, statistic, columns=STEPS, cache=cache)
    assert found.complete and not found.damaged
    return [row.high.tolist() for row in found.rows]


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def test_a_fresh_viewer_reads_the_statistics_from_disk_not_the_trial(tmp_path, cache_dir):
    path = _write(tmp_path / "run")
    first = _highs(create_trial(path), StatisticCache(root=cache_dir))
    assert first[2][5] == pytest.approx(_l2(2, 5))
    files = list((cache_dir / "statistics").glob("*.npz"))
    assert [f.name for f in files] == [stored_mod.trial_file(cache_dir, os.path.abspath(path)).name]
    # the records gone: a viewer that decoded anything would now see damaged steps
    shutil.rmtree(os.path.join(path, "events"))
    again = create_trial(path)
    assert _highs(again, StatisticCache(root=cache_dir)) == first
    # the overview's other statistics were computed from the same raw values and kept too
    abs_max = _highs(again, StatisticCache(root=cache_dir), "abs_max")
    assert abs_max[1][3] == pytest.approx(float(np.abs(_value(1, 3)).max()))


def test_a_step_rewritten_since_is_read_again(tmp_path, cache_dir):
    path = tmp_path / "run"
    _write(path)
    _highs(create_trial(str(path)), StatisticCache(root=cache_dir))
    shutil.rmtree(path)
    _write(path, bumped=7)  # the same folder, step 7 saved with other values
    trial = create_trial(str(path))
    calls: list[int] = []
    real = trial.read_tensors
    trial.read_tensors = lambda locs: calls.append(len(locs)) or real(locs)  # type: ignore[method-assign]
    highs = _highs(trial, StatisticCache(root=cache_dir))
    assert highs[0][7] == pytest.approx(_l2(0, 7, 10.0))  # the new value, not the saved one
    assert highs[0][6] == pytest.approx(_l2(0, 6))
    assert calls == [3]  # step 7 of the three tensors, nothing else


def test_a_live_trial_restores_its_complete_steps_and_reads_only_the_new_ones(tmp_path, cache_dir):
    path = str(tmp_path / "live")
    _write(Path(path), range(6), end=False)
    assert _highs(create_trial(path), StatisticCache(root=cache_dir))[0][:6] == pytest.approx(
        [_l2(0, s) for s in range(6)])
    _write(Path(path), range(6, STEPS))
    trial = create_trial(path)
    calls: list[int] = []
    real = trial.read_tensors
    trial.read_tensors = lambda locs: calls.append(len(locs)) or real(locs)  # type: ignore[method-assign]
    highs = _highs(trial, StatisticCache(root=cache_dir))
    assert highs[1] == pytest.approx([_l2(1, s) for s in range(STEPS)])
    assert sum(calls) == 3 * (STEPS - 6)


def test_a_damaged_cache_file_is_set_aside_and_rebuilt(tmp_path, cache_dir, caplog):
    path = _write(tmp_path / "run")
    want = _highs(create_trial(path), StatisticCache(root=cache_dir))
    file = stored_mod.trial_file(cache_dir, os.path.abspath(path))
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="mltrace.analysis"):
        got = _highs(create_trial(path), StatisticCache(root=cache_dir))
    assert got == want
    assert str(file) in caplog.text and "rebuilt" in caplog.text
    assert file.with_suffix(".bad").exists() and file.exists()  # set aside, then saved again


def test_another_trials_file_is_not_used(tmp_path, cache_dir, caplog):
    a = _write(tmp_path / "a")
    b = _write(tmp_path / "b", bumped=0)
    _highs(create_trial(a), StatisticCache(root=cache_dir))
    stored_mod.trial_file(cache_dir, os.path.abspath(b)).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(stored_mod.trial_file(cache_dir, os.path.abspath(a)), stored_mod.trial_file(cache_dir, os.path.abspath(b)))
    with caplog.at_level(logging.WARNING, logger="mltrace.analysis"):
        highs = _highs(create_trial(b), StatisticCache(root=cache_dir))
    assert highs[0][0] == pytest.approx(_l2(0, 0, 10.0))
    assert repr(a) in caplog.text


def test_an_unwritable_cache_folder_warns_once_and_the_view_still_answers(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    path = _write(tmp_path / "run")
    cache = StatisticCache(root=blocker)
    with caplog.at_level(logging.WARNING, logger="mltrace.analysis"):
        highs = _highs(create_trial(path), cache)
    assert highs[2][0] == pytest.approx(_l2(2, 0))
    assert "MLTRACE_CACHE_DIR" in caplog.text and cache.root is None


def test_a_trial_opened_by_another_path_uses_the_same_file(tmp_path, cache_dir, monkeypatch):
    path = _write(tmp_path / "run")
    _highs(create_trial(path), StatisticCache(root=cache_dir))
    shutil.rmtree(os.path.join(path, "events"))  # only the cache can answer now
    monkeypatch.chdir(tmp_path)
    relative = create_trial("run")
    assert relative.path == "run"
    assert _highs(relative, StatisticCache(root=cache_dir))[1][4] == pytest.approx(_l2(1, 4))


def test_the_cache_folder_comes_from_the_environment(tmp_path):
    assert stored_mod.cache_root({"MLTRACE_CACHE_DIR": "off"}) is None
    assert stored_mod.cache_root({"MLTRACE_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert stored_mod.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "mltrace"
    assert stored_mod.cache_root({}) == Path.home() / ".cache" / "mltrace"


def test_switched_off_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("MLTRACE_CACHE_DIR", "off")
    path = _write(tmp_path / "run")
    cache = StatisticCache()
    assert cache.root is None
    _highs(create_trial(path), cache)
    assert not any(tmp_path.rglob("*.npz"))


def test_a_step_brought_twice_is_held_once():
    """Two readers of one entry (a restore and a read, two requests) may bring the same step."""
    from mltrace.analysis import StepValues

    entry = StepValues()
    entry.extend([3, 1], [30.0, 10.0])
    entry.extend([2, 3], [20.0, 99.0])
    assert entry.steps.tolist() == [1, 2, 3] and entry.values.tolist() == [10.0, 20.0, 30.0]


def test_viewers_of_one_trial_at_once_share_one_restore(tmp_path, cache_dir):
    import threading

    path = _write(tmp_path / "run")
    want = _highs(create_trial(path), StatisticCache(root=cache_dir))
    trial = create_trial(path)
    cache = StatisticCache(root=cache_dir)
    got: dict[int, list[list[float]]] = {}
    statistics = ("l2", "l2", "abs_max", "l2")
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, _highs(trial, cache,
                                                                             statistics[k])))
               for k in range(len(statistics))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[k] for k in (0, 1, 3)] == [want] * 3
    assert got[2][1][3] == pytest.approx(float(np.abs(_value(1, 3)).max()))
    found = tensor_heatmap(trial, NAMES, "l2", columns=STEPS, cache=cache)
    assert [int(r.count.sum()) for r in found.rows] == [STEPS] * 3


def test_the_folder_keeps_the_files_used_last_within_its_bound(tmp_path):
    folder = tmp_path / "statistics"
    folder.mkdir()
    files = []
    for k, when in enumerate((100, 300, 200, 400)):
        file = folder / f"{k}.npz"
        file.write_bytes(b"x" * 1000)
        os.utime(file, (when, when))
        files.append(file)
    deleted = stored_mod.prune(folder, max_bytes=2500, keep=files[0])
    # the oldest (files[0]) is the one just written: kept; then 2 and 1 go, oldest first
    assert deleted == [files[2], files[1]]
    assert sorted(p.name for p in folder.iterdir()) == ["0.npz", "3.npz"]
    assert stored_mod.prune(folder, max_bytes=10_000) == []


def test_reading_a_trials_file_marks_it_used(tmp_path, cache_dir):
    path = _write(tmp_path / "run")
    _highs(create_trial(path), StatisticCache(root=cache_dir))
    file = stored_mod.trial_file(cache_dir, os.path.abspath(path))
    os.utime(file, (1, 1))
    _highs(create_trial(path), StatisticCache(root=cache_dir))
    assert file.stat().st_mtime > 1
