"""mltrace.analysis, the one analysis layer under the TensorBoard plugin, the MLflow summary,
comparison and plots and ``mltrace info``; and the reductions it computes with (numpy's)."""

from __future__ import annotations

import numpy as np
import pytest

from mltrace import analysis
from mltrace.analysis import series as series_module
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.reductions import REDUCTION_NAMES, compute, compute_many, parse_statistic
from mltrace.trials import create_trial
from tests.support.rule_trials import red, write_trial

TRAIN, EVAL, GLOBAL = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.GLOBAL
TRAIN_STEPS, EVAL_STEPS = 6, 2


def _w(step: int, worker: int) -> np.ndarray:
    """The raw tensor ``w`` of a worker at a global step (the workers' values differ)."""
    return np.array([-1.0, 2.0, 3.0, 0.0], dtype=np.float32) * (step + 1) + 10 * worker


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """Two workers; TRAIN steps 0-5 then EVAL steps 6-7 (mode steps 0-1). ``w`` raw, ``loss`` a
    scalar, ``g`` only stored reductions (mean, l2, abs max)."""
    path = tmp_path_factory.mktemp("analysis") / "run"
    modes = {s: TRAIN if s < TRAIN_STEPS else EVAL for s in range(TRAIN_STEPS + EVAL_STEPS)}
    for k, worker in enumerate(("worker_0", "worker_1")):
        data = {}
        for s in modes:
            g = np.linspace(-1, 1, 5) * (s + 1) + k
            data[s] = {"w": _w(s, k), "loss": np.float32(1.0 / (s + 1) + k),
                       red("g", "mean"): g.mean(), red("g", "l2"): np.linalg.norm(g),
                       red("g", "max", abs=True): np.abs(g).max()}
        write_trial(path, data, modes=modes, collections={"weights": ["^w$"], "losses": ["loss"]},
                    worker=worker)
    return create_trial(str(path), timeout=0)


# -- thinning -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 2, 5, 17, 100, 1001])
@pytest.mark.parametrize("limit", [2, 3, 10, 50])
def test_thin_keeps_first_and_last_and_the_count(n, limit):
    items = list(range(n))
    got = analysis.thin(items, limit)
    assert len(got) == min(n, limit)
    assert got == sorted(set(got))  # in order, each once
    if n:
        assert got[0] == 0 and got[-1] == n - 1


def test_thin_without_a_limit_keeps_all_and_a_limit_of_one_the_last():
    assert analysis.thin([3, 4, 5], None) == [3, 4, 5] and analysis.thin([3, 4, 5], 0) == [3, 4, 5]
    assert analysis.thin([3, 4, 5], 1) == [5]
    assert analysis.thin(list(range(10)), 4) == [0, 3, 6, 9]


# -- series -------------------------------------------------------------------------------------
def test_series_per_mode_has_mode_steps_and_global_steps(trial):
    train = analysis.tensor_series(trial, "w", TRAIN)
    assert train.steps == train.global_steps == list(range(TRAIN_STEPS))
    assert set(train.values) == set(analysis.RAW_STATISTICS)
    assert train.values["max"] == [float(_w(s, 0).max()) for s in range(TRAIN_STEPS)]
    assert train.values["mean"] == [float(np.mean(_w(s, 0))) for s in range(TRAIN_STEPS)]
    cov = train.coverage
    assert not cov.thinned and cov.total == cov.read == TRAIN_STEPS and not cov.damaged
    ev = analysis.tensor_series(trial, "w", EVAL)
    assert ev.steps == [0, 1] and ev.global_steps == [6, 7]
    assert ev.values["min"] == [float(_w(6, 0).min()), float(_w(7, 0).min())]
    everything = analysis.tensor_series(trial, "w", GLOBAL)
    assert everything.steps == list(range(TRAIN_STEPS + EVAL_STEPS))
    assert analysis.tensor_modes(trial, "w") == [TRAIN, EVAL]


def test_series_per_worker(trial):
    assert analysis.tensor_workers(trial, "w", TRAIN) == ["worker_0", "worker_1"]
    first = analysis.tensor_series(trial, "w", TRAIN, worker="worker_0")
    second = analysis.tensor_series(trial, "w", TRAIN, worker="worker_1")
    assert first.values["mean"] == [float(np.mean(_w(s, 0))) for s in range(TRAIN_STEPS)]
    assert second.values["mean"] == [float(np.mean(_w(s, 1))) for s in range(TRAIN_STEPS)]
    assert analysis.tensor_series(trial, "w", TRAIN).values == first.values  # default: first worker


def test_a_scalar_is_its_value_and_stored_reductions_come_first(trial):
    loss = analysis.tensor_series(trial, "loss", TRAIN)
    assert list(loss.values) == [analysis.VALUE]
    assert loss.values["value"] == [float(np.float32(1.0 / (s + 1))) for s in range(TRAIN_STEPS)]
    g = analysis.tensor_series(trial, "g", TRAIN)
    assert set(g.values) == {"mean", "l2", "abs_max"}
    assert g.values["abs_max"][2] == pytest.approx(3.0)
    assert analysis.tensor_series(trial, "g", TRAIN, names=["median"]).values == {}  # no raw value


def test_named_statistics_are_stored_else_computed(trial):
    t = trial.tensor("w")
    got = analysis.step_statistics(
        t, 2, TRAIN, names=["abs_max", "median", "l2_norm", "zero_fraction"]
    )
    value = _w(2, 0).astype(np.float64)
    assert got == {
        "abs_max": np.abs(value).max(),
        "median": float(np.median(value)),
        "l2_norm": pytest.approx(np.linalg.norm(value)),
        "zero_fraction": 0.25,
    }
    assert analysis.step_statistics(
        trial.tensor("g"), 1, TRAIN, "worker_1", ["mean", "abs_max"]
    ) == {"mean": pytest.approx(1.0), "abs_max": pytest.approx(3.0)}
    assert analysis.step_statistics(trial.tensor("loss"), 0, TRAIN, names=["mean"]) == {"mean": 1.0}
    with pytest.raises(MltraceValueError, match="unknown reduction 'bogus'"):
        analysis.step_statistics(t, 0, TRAIN, names=["bogus"])


def test_thinned_series_says_so_and_keeps_first_and_last(trial):
    thinned = analysis.tensor_series(trial, "w", TRAIN, max_points=3)
    assert thinned.steps == [0, 2, 5] and thinned.coverage == analysis.Coverage(6, 3)
    assert thinned.coverage.thinned
    assert thinned.last("max") == float(_w(5, 0).max()) and thinned.last("nope") is None


def test_a_cached_series_reads_no_step_again(trial, monkeypatch):
    cache = analysis.SeriesCache()
    first = analysis.tensor_series(trial, "w", TRAIN, cache=cache)
    monkeypatch.setattr(
        series_module, "step_statistics", lambda *a: pytest.fail(f"read again: {a}")
    )
    assert analysis.tensor_series(trial, "w", TRAIN, cache=cache).values == first.values


# -- histograms ---------------------------------------------------------------------------------
def test_histograms_count_every_finite_value(trial):
    found = analysis.tensor_histograms(trial, "w", TRAIN, bins=4, max_steps=2)
    assert found.steps == [0, 5] and found.coverage == analysis.Coverage(TRAIN_STEPS, 2)
    for step, h in zip(found.steps, found.histograms):
        value = _w(step, 0)
        assert int(h.counts.sum()) == value.size and len(h.buckets()) == 4
        assert h.edges[0] == value.min() and h.edges[-1] == value.max()
    assert analysis.tensor_histograms(trial, "g", TRAIN).coverage.total == 0  # reductions only
    assert analysis.histogram(np.array([np.nan, np.inf]), 5) is None
    assert analysis.histogram(np.array([2.0, 2.0, np.nan]), 5).buckets() == [[2.0, 2.0, 2.0]]
    assert analysis.finite_values(np.array([1, np.nan, -np.inf, 3])).tolist() == [1.0, 3.0]
    assert analysis.finite_values(np.array(["a", "b"])).size == 0
    edges = analysis.common_edges([np.array([0.0, 1.0]), np.array([4.0, np.nan])], 4)
    assert edges.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert analysis.common_edges([], 2).tolist() == [0.0, 0.5, 1.0]


# -- trial overview -----------------------------------------------------------------------------
def test_trial_overview(trial):
    info = analysis.trial_overview(trial)
    assert info.workers == ["worker_0", "worker_1"] and info.ended
    assert {m: s.to_dict() for m, s in info.modes.items()} == {
        "TRAIN": {"steps": 6, "first": 0, "last": 5},
        "EVAL": {"steps": 2, "first": 0, "last": 1},
    }
    assert info.tensors == ["g", "loss", "w"]
    assert list(info.collections) == ["default", "losses", "weights"]
    assert info.members == {"default": [], "losses": ["loss"], "weights": ["w"]}
    assert info.collections_of("w") == ["weights"] and info.collections_of("g") == []
    assert analysis.StepSpan.of([]) == analysis.StepSpan(0, None, None)


def test_match_tensors_takes_names_and_regexes_in_order(trial):
    assert analysis.match_tensors(trial, ["w", "^[gl]", "loss"]) == ["w", "g", "loss"]
    assert analysis.match_tensors(trial, "nothing") == []
    assert analysis.format_statistic(None) == "-" and analysis.format_statistic(1 / 3) == "0.33333"
    assert analysis.format_statistic(2.0 / 3, digits=2) == "0.67"
    assert analysis.format_statistic(7) == "7"


# -- reductions: one definition, numpy's ---------------------------------------------------------
def numpy_reductions(a: np.ndarray) -> dict[str, float]:
    """Each reduction by numpy, written independently of mltrace.reductions (norms by linalg)."""
    return dict(min=a.min(), max=a.max(), mean=a.mean(), std=a.std(), variance=a.var(), sum=a.sum(),
                prod=a.prod(), median=np.median(a), l1=np.linalg.norm(a, 1), l2=np.linalg.norm(a),
                nan_count=np.isnan(a).sum(), inf_count=np.isinf(a).sum(), zero_fraction=np.mean(a == 0))


@pytest.mark.parametrize("value", [
    np.random.default_rng(0).normal(size=(3, 5)), np.arange(-4, 8, dtype=np.int8).reshape(3, 4),
    np.array([True, False, True, True]), np.array([0.5, -2.0, 0.0, 7.25], dtype=np.float32),
])
def test_reductions_equal_numpys(value):
    flat = (value.astype(np.float64) if value.dtype.kind in "biu" else value).reshape(-1)
    expected = {**numpy_reductions(flat),
                **{f"abs_{k}": v for k, v in numpy_reductions(np.abs(flat)).items()}}
    names = [*REDUCTION_NAMES, *(f"abs_{n}" for n in REDUCTION_NAMES)]
    assert set(expected) == set(names)  # every reduction mltrace defines is checked
    many = compute_many(value, names)
    assert set(many) == set(names)
    for name in names:
        base, is_abs = parse_statistic(name)
        assert float(many[name]) == pytest.approx(float(expected[name]), rel=1e-6), name
        assert float(compute(base, value, abs=is_abs)) == float(many[name]), name
    assert analysis.value_statistics(value, ["mean"]) == {"mean": float(many["mean"])}


def test_reductions_of_nothing_and_of_nan():
    assert compute_many(np.array([]), ["mean", "l2"]) == {}
    assert compute("mean", np.array([])) is None
    assert np.isnan(compute("mean", np.array([1.0, np.nan])))
    assert compute("nan_count", np.array([1.0, np.nan, np.nan])) == 2
    with pytest.raises(MltraceValueError, match="choose from"):
        compute_many(np.array([]), ["abs_bogus"])
    assert parse_statistic("abs_l2_norm") == ("l2", True)
    assert parse_statistic("max") == ("max", False)
