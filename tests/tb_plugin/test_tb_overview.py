"""The mltrace tab's overview (mltrace.analysis.heatmap under tb_plugin/overview.py), its Rules
panel (one row per rule with its history, NothingChecked, global and mode steps, MLflow links only
where a result recorded one) and following a live trial, over real trials; routes through TensorBoard's
own WSGI app (werkzeug test client)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tensorboard import default, errors, program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider as tb_data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer as multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from mltrace.analysis import StatisticCache, StepValues, bucket_rows, tensor_heatmap
from mltrace.format import paths
from mltrace.modes import ModeKeys
from mltrace.rules import invoke_rule
from mltrace.rules.builtin import rule_class
from mltrace.rules.results import NO_ISSUES_FOUND, NOTHING_CHECKED, RuleResult
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from mltrace_tb import metadata, overview
from mltrace_tb.plugin import MltracePlugin
from tests.support.rule_trials import red, write_trial

STEPS = 1000


def _values(k: int) -> np.ndarray:
    """l2 of gradient k over STEPS steps: decades apart per tensor, a NaN, an inf and zeros."""
    v = np.geomspace(1.0, 1e-6, STEPS) * 10.0 ** (-3 * k)
    if k == 1:
        v[437] = np.nan
        v[800:] = 0.0
    if k == 2:
        v[5] = np.inf
    return v


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("overview")
    data = {s: {red(f"gradient/layer{k}.weight", "l2"): _values(k)[s] for k in range(3)} for s in range(STEPS)}
    for s in range(STEPS):
        data[s]["loss"] = np.float32(1.0 / (s + 1))
    modes = {s: ("train", s) if s < 900 else ("eval", s - 900) for s in range(STEPS)}
    write_trial(root / "big", data, modes=modes, collections={"gradients": ["^gradient/"], "losses": ["^loss$"]})
    return root


@pytest.fixture(scope="module")
def plugin(root):
    return MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[str(root)])


def test_overview_rows_are_a_collections_tensors_with_min_max_per_bucket(plugin):
    answer = plugin.overview_impl("big", columns=50)
    assert answer["collection"] == "gradients"  # the default when the trial has it
    assert answer["collections"] == ["gradients", "losses"]
    assert [r["tensor"] for r in answer["rows"]] == [f"gradient/layer{k}.weight" for k in range(3)]
    assert answer["steps"] == STEPS and answer["bucketed"] and len(answer["starts"]) == 50
    assert answer["starts"][0] == 0 and answer["ends"][-1] == STEPS - 1 and answer["starts"][1] == 20
    assert answer["start_modes"][0] == "TRAIN 0" and answer["start_modes"][-1] == "EVAL 80"
    for k, row in enumerate(answer["rows"]):
        v = _values(k)
        for c in (0, 21, 49):
            cell = v[answer["starts"][c]:answer["ends"][c] + 1]
            finite = cell[np.isfinite(cell)]
            assert row["count"][c] == len(cell)
            assert row["low"][c] == pytest.approx(finite.min(), rel=1e-4)
            assert row["high"][c] == pytest.approx(finite.max(), rel=1e-4)
    # one NaN among 1000 steps and one inf are never lost to a bucket; zeros stay zeros
    assert answer["rows"][1]["nonfinite"] == [[21, 1, 0, 0]]
    assert answer["rows"][2]["nonfinite"] == [[0, 0, 1, 0]]
    assert answer["rows"][1]["high"][45] == 0.0
    json.dumps(answer, allow_nan=False)  # valid JSON: no NaN anywhere


def test_overview_statistics_modes_filter_and_errors(plugin):
    every = plugin.overview_impl("big", columns=2000)
    assert not every["bucketed"] and len(every["starts"]) == STEPS
    evals = plugin.overview_impl("big", mode=ModeKeys.EVAL, columns=2000)
    assert evals["starts"][0] == 900 and evals["steps"] == 100 and evals["mode"] == "EVAL"
    everything = plugin.overview_impl("big", collection="*")
    assert everything["collection"] == "" and [r["tensor"] for r in everything["rows"]][-1] == "loss"
    only = plugin.overview_impl("big", pattern="LAYER[12]")
    assert [r["tensor"] for r in only["rows"]] == ["gradient/layer1.weight", "gradient/layer2.weight"]
    assert only["tensors_in_collection"] == 3
    assert overview.name_filter("layer[").search("a layer[0]")  # not a regex: the text itself
    # nan_count of a tensor that stored only l2 is computed from nothing: rows stay, cells empty
    counts = plugin.overview_impl("big", collection="losses", statistic="nan_count")
    assert counts["rows"][0]["high"][:3] == [0.0, 0.0, 0.0]
    for bad in ({"statistic": "mean"}, {"collection": "nope"}, {"columns": 0}):
        with pytest.raises(errors.InvalidArgumentError):
            plugin.overview_impl("big", **bad)


def test_overview_at_500_tensors_by_10000_steps_is_cut_down_on_the_server():
    """500 tensors x 10,000 steps become at most `columns` buckets per row; each keeps the
    finite min and max of its steps, and every NaN and infinity is counted, none dropped."""
    rng = np.random.default_rng(0)
    steps = np.arange(10_000)
    found, planted = [], []
    for k in range(500):
        values = rng.lognormal(-5, 2, size=10_000)
        bad = int(rng.integers(0, 10_000))
        values[bad] = np.nan if k % 2 else -np.inf
        planted.append(bad)
        found.append((f"g{k}", StepValues(steps, values)))
    out = bucket_rows(found, "l2", 400)
    assert len(out.rows) == 500 and len(out.starts) == 400 and out.steps == 10_000 and out.bucketed
    assert out.starts[1] == 25 and out.ends[0] == 24
    for (name, sv), row, bad in zip(found, out.rows, planted):
        assert int(row.nan.sum() + row.neginf.sum()) == 1 and row.count.sum() == 10_000
        col = bad // 25
        assert (row.nan[col] if name[1:].isdigit() and int(name[1:]) % 2 else row.neginf[col]) == 1
        cell = sv.values[col * 25:(col + 1) * 25]
        assert row.low[col] == np.nanmin(cell[np.isfinite(cell)]) and row.high[3] == sv.values[75:100].max()


def _result(rule: str, status: str, started: float, fired: list[int] | None = None, **kw) -> RuleResult:
    return RuleResult(rule=rule, trial="t", parameters={}, status=status, started=started, ended=started + 5,
                      evaluated_steps=10, fired_steps=fired or [], first_step=(fired or [None])[0], **kw)


def test_rules_one_row_per_rule_with_history_and_mode_steps(tmp_path):
    path = write_trial(tmp_path / "r", {s: {"loss": 1.0} for s in range(12)},
                       modes={s: ("train", s) if s < 8 else ("eval", s - 8) for s in range(12)})
    storage = open_storage(path)
    for result in (_result("LossNotDecreasing", NO_ISSUES_FOUND, 1000.0),
                   _result("LossNotDecreasing", "IssuesFound", 2000.0, [9, 10], message="(EVAL) at step 1"),
                   _result("DeadRelu", NOTHING_CHECKED, 1500.0),
                   _result("VanishingGradient", NO_ISSUES_FOUND, 1600.0)):
        storage.write(result.key, result.to_json().encode())
    storage.write(paths.MLFLOW_RUN_FILE, json.dumps({"run_id": "r1", "experiment_id": "3",
                                                     "tracking_uri": "sqlite:////tmp/x/mlflow.db"}).encode())
    plugin = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[path])
    answer = plugin.rules_impl("r")
    assert [(r["rule"], r["status"], r["runs"]) for r in answer["rules"]] == [
        ("LossNotDecreasing", "IssuesFound", 2), ("DeadRelu", NOTHING_CHECKED, 1),
        ("VanishingGradient", NO_ISSUES_FOUND, 1)]
    newest, older = answer["rules"][0]["history"]
    assert newest["started"] == 2000.0 and older["status"] == NO_ISSUES_FOUND
    assert newest["fired"] == [{"step": 9, "mode": "EVAL", "mode_step": 1}, {"step": 10, "mode": "EVAL", "mode_step": 2}]
    assert newest["first"] == {"step": 9, "mode": "EVAL", "mode_step": 1}
    # a database tracking store: no UI is known to serve it, so no link, only the command to serve it
    assert answer["mlflow"] == {"base": None,
                                "command": "mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db"}
    linked = _result("Overfit", "IssuesFound", 3000.0, [1], mlflow_run_id="c9", mlflow_experiment_id="3")
    storage.write(linked.key, linked.to_json().encode())
    row = plugin.rules_impl("r")["rules"][0]
    assert row["rule"] == "Overfit" and row["history"][0]["mlflow_url"] is None


def test_dead_relu_with_no_relu_tensor_reports_nothing_checked(tmp_path):
    path = write_trial(tmp_path / "n", {s: {"dense_output": np.ones((4, 3))} for s in range(3)})
    trial = create_trial(path)
    result = invoke_rule(rule_class("DeadRelu")(trial), end_step=3)
    assert result.status == NOTHING_CHECKED and result.evaluated_steps == 3
    # with a ReLU output it checks and finds nothing: not the same status
    path = write_trial(tmp_path / "y", {s: {"relu_output": np.ones((4, 3))} for s in range(3)})
    assert invoke_rule(rule_class("DeadRelu")(create_trial(path)), end_step=3).status == NO_ISSUES_FOUND


def test_a_live_trial_shows_new_tensors_and_steps(tmp_path):
    from mltrace.collections import Collection, CollectionManager
    from mltrace.modes import ModeKeys
    from mltrace.writer import TrialWriter

    location = str(tmp_path / "live")
    writer = TrialWriter(open_storage(location), "worker_0")
    manager = CollectionManager()
    manager.add(Collection("gradients", include_regex=["^gradient/"]))
    writer.write_collections(manager.to_json())

    def step(s: int, names: list[str]) -> None:
        writer.open_step(s, ModeKeys.TRAIN, s)
        for n in names:
            writer.add_tensor(red(n, "l2"), np.float64(s + 1), ModeKeys.TRAIN, s, wall_time=1.0)
        writer.close_step()
        writer.flush()  # the writer's thread puts the files on disk

    for s in range(3):
        step(s, ["gradient/a"])
    plugin = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[location])
    first = plugin.overview_impl("live")
    assert not first["ended"] and [r["tensor"] for r in first["rows"]] == ["gradient/a"]
    assert plugin.run_impl("live")["ended"] is False
    for s in range(3, 6):
        step(s, ["gradient/a", "gradient/b"])
    writer.write_end_marker()
    writer.close()
    later = plugin.overview_impl("live")  # the same open trial, no flag, no restart
    assert later["ended"] and later["steps"] == 6
    assert [r["tensor"] for r in later["rows"]] == ["gradient/a", "gradient/b"]
    assert later["rows"][0]["high"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert later["rows"][1]["count"] == [0, 0, 0, 1, 1, 1]


def test_heatmap_reads_each_step_once(root, monkeypatch):
    from mltrace.trials import Trial

    trial = create_trial(str(root / "big"))
    cache = StatisticCache()
    names = [f"gradient/layer{k}.weight" for k in range(3)]
    tensor_heatmap(trial, names, "l2", cache=cache)
    calls = []
    real = Trial.read_tensors
    monkeypatch.setattr(Trial, "read_tensors", lambda self, locs: calls.append(len(locs)) or real(self, locs))
    again = tensor_heatmap(trial, names, "l2", cache=cache)
    assert calls == [] and again.steps == STEPS


def test_a_first_look_within_a_deadline_is_coarse_first_then_fills_in(root):
    """With a deadline, an answer comes with what was read so far (``complete`` False) and the
    next asks go on where it stopped, coarse first: the end is the same matrix as reading all."""
    import time

    trial = create_trial(str(root / "big"))
    names = [f"gradient/layer{k}.weight" for k in range(3)]
    cache = StatisticCache(root=None)  # not the statistics an earlier test saved for this trial
    first = tensor_heatmap(trial, names, "l2", columns=50, cache=cache, deadline=time.monotonic())
    assert not first.complete and all(int(r.count.sum()) < STEPS for r in first.rows)
    answers = 1
    found = first
    while not found.complete:
        found = tensor_heatmap(trial, names, "l2", columns=50, cache=cache, deadline=time.monotonic() + 0.01)
        answers += 1
        assert answers < 100
    whole = tensor_heatmap(trial, names, "l2", columns=50)
    assert answers > 1 and found.starts == whole.starts
    for got, want in zip(found.rows, whole.rows):
        assert np.array_equal(got.count, want.count) and np.array_equal(got.nan, want.nan)
        assert np.allclose(got.high, want.high, equal_nan=True) and np.allclose(got.low, want.low, equal_nan=True)
    # the pass with stride 64 reads every 64th step of each tensor before any finer one
    coarse = StatisticCache()
    tensor_heatmap(trial, names[:1], "l2", cache=coarse, deadline=time.monotonic() + 0.5)
    got = coarse.get((trial.path, names[0], "l2", None))
    assert set(range(0, STEPS, 64)) <= set(got.steps.tolist())


def test_a_damaged_step_is_left_out_and_said_so_on_every_answer(tmp_path):
    import glob

    path = write_trial(tmp_path / "d", {s: {red("gradient/g", "l2"): float(s + 1)} for s in range(6)},
                       collections={"gradients": ["^gradient/"]})
    (events,) = glob.glob(f"{path}/events/000000000003/*.tfevents")
    data = bytearray(open(events, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(events, "wb").write(bytes(data))
    plugin = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[path])
    for _ in range(2):  # the second answer comes from what the plugin kept, and still says so
        answer = plugin.overview_impl("d")
        assert [d["step"] for d in answer["damaged"]] == [3]
        assert answer["starts"] == [0, 1, 2, 4, 5]  # the others are all there
        assert answer["rows"][0]["high"] == [1.0, 2.0, 3.0, 5.0, 6.0]


def test_overview_per_worker(tmp_path):
    from tests.support.tb_trials import make_worker_trial

    path = make_worker_trial(tmp_path / "w")
    plugin = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[path])
    first = plugin.overview_impl("w", collection="weights")
    second = plugin.overview_impl("w", collection="weights", worker="worker_1")
    assert first["workers"] == ["worker_0", "worker_1"] and second["worker"] == "worker_1"
    l2 = [float(np.linalg.norm(np.array([1.0, 2.0, 3.0]) * (s + 1) + 10)) for s in range(4)]
    assert second["rows"][0]["high"] == pytest.approx(l2, rel=1e-4)
    assert first["rows"][0]["high"] == pytest.approx([float(np.linalg.norm(np.array([1.0, 2.0, 3.0]) * (s + 1)))
                                                      for s in range(4)], rel=1e-4)
    with pytest.raises(errors.InvalidArgumentError, match="worker_0, worker_1"):
        plugin.overview_impl("w", worker="worker_9")


# -- routes --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(root):
    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(argv=[None, "--logdir", str(root), f"--{metadata.LOGDIR_FLAG}", str(root)])
    provider = tb_data_provider.MultiplexerDataProvider(multiplexer.EventMultiplexer(), str(root))
    app = application.TensorBoardWSGIApp(tb.flags, default.get_plugins(), provider)
    return werkzeug_test.Client(app, wrappers.Response)


def test_overview_route(client):
    r = client.get("/data/plugin/mltrace/overview", query_string={"run": "big", "statistic": "l2", "columns": "10",
                                                                  "filter": "layer0"})
    body = json.loads(r.get_data())
    assert r.status_code == 200 and len(body["starts"]) == 10 and [x["tensor"] for x in body["rows"]] == [
        "gradient/layer0.weight"]
    assert r.headers["Cache-Control"].startswith("no-cache")  # TensorBoard's reload always gets news
    for params, code in (({"run": "big", "statistic": "bogus"}, 400), ({"run": "big", "columns": "0"}, 400),
                         ({"run": "big", "columns": "5000"}, 400), ({"run": "big", "collection": "x"}, 400),
                         ({"run": "big", "mode": "TRAINING"}, 400), ({"run": "../big"}, 404), ({}, 400)):
        r = client.get("/data/plugin/mltrace/overview", query_string=params)
        assert r.status_code == code and "error" in json.loads(r.get_data()), params
    assert "l2, abs_max, nan_count, zero_fraction" in json.loads(
        client.get("/data/plugin/mltrace/overview", query_string={"run": "big", "statistic": "x"}).get_data())["error"]


def test_frontend_modules_and_uplot_are_served(client):
    for name, mime in (("static/data.js", "text/javascript"), ("static/uPlot.esm.js", "text/javascript"),
                       ("static/uPlot.min.css", "text/css"), ("static/overview.js", "text/javascript")):
        r = client.get(f"/data/plugin/mltrace/{name}")
        assert r.status_code == 200 and r.mimetype == mime, name
    assert client.get("/data/plugin/mltrace/static/package.json").status_code == 404
    assert client.get("/data/plugin/mltrace/static/uPlot.LICENSE").status_code == 404
