"""The mltrace TensorBoard plugin: impl methods over real trials, its routes inside TensorBoard's
own WSGI app (werkzeug test client), security of every route, the entry point's robustness and
``mltrace tensorboard``. A real TensorBoard process and a browser are in test_tb_browser.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tensorboard import default, errors, program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider as tb_data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer as multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

import mltrace.pytorch as smd
from mltrace.analysis import series as analysis_series
from mltrace.format import paths
from mltrace.modes import ModeKeys
from mltrace.storage import register_scheme
from mltrace.trials import create_trial
from mltrace_tb import discovery, launch, loader, metadata, rules_view, views
from mltrace_tb.plugin import MltracePlugin
from tests.support.rule_trials import write_trial
from tests.support.tb_trials import (
    GRAD,
    LOSS,
    MLFLOW_URL,
    WEIGHT,
    make_plain_tensorboard_run,
    make_torch_trial,
    make_worker_trial,
)

TRAIN, EVAL = ModeKeys.TRAIN, ModeKeys.EVAL


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A logdir with two trials (one nested a level deeper), a plain TensorBoard run, and a
    trial with a long series."""
    root = tmp_path_factory.mktemp("logs")
    make_torch_trial(root / "exp1" / "runA")
    make_worker_trial(root / "runW")
    make_plain_tensorboard_run(root / "plain")
    steps = {s: {"long": np.float32(s) * 0.5} for s in range(1200)}
    write_trial(root / "runLong", steps, collections={"losses": ["^long$"]})
    return root


@pytest.fixture(scope="module")
def plugin(logdir):
    return MltracePlugin(base_plugin.TBContext(logdir=str(logdir)), mltrace_logdirs=[str(logdir)],
                         mlflow_uri=None)


# -- discovery -----------------------------------------------------------------------------------
def test_trials_are_found_without_entering_them(logdir, plugin):
    runs = plugin.runs_impl()["runs"]
    assert [r["name"] for r in runs] == ["exp1/runA", "runLong", "runW"]  # the plain run is no trial
    assert runs[0]["location"] == os.path.realpath(logdir / "exp1" / "runA")
    # --logdir inside a trial's export finds the trial one level above tensorboard/
    inside = MltracePlugin(base_plugin.TBContext(logdir=str(logdir / "exp1" / "runA" / "tensorboard" / "TRAIN")))
    assert [r["name"] for r in inside.runs_impl()["runs"]] == ["runA"]
    assert inside.is_active() and not MltracePlugin(base_plugin.TBContext(logdir=str(logdir / "plain"))).is_active()
    # TensorBoard run names of exports below the logdir (what a data provider reports)
    refs = discovery.discover([], str(logdir), ["exp1/runA/tensorboard/TRAIN", "plain"])
    assert [(r.name, r.location) for r in refs if r.name == "exp1/runA"]
    # a context with nothing set (TensorBoard's contexts may hold None everywhere)
    assert MltracePlugin(base_plugin.TBContext()).runs_impl()["runs"] == []


# -- impl methods ----------------------------------------------------------------------------------
def test_series_are_the_trials_reductions_at_every_step(logdir, plugin):
    trial = create_trial(str(logdir / "exp1" / "runA"))
    answer = plugin.series_impl(["exp1/runA"], GRAD)
    (run,) = answer["runs"]
    assert list(run["modes"]) == ["TRAIN"]  # gradients are not saved in EVAL
    train = run["modes"]["TRAIN"]
    assert train["steps"] == trial.tensor(GRAD).steps(TRAIN) == [0, 1, 2, 3, 4, 5]
    assert "downsampled" not in train
    assert set(train["values"]) == {"min", "max", "mean", "std", "l2", "abs_max"}
    for i, step in enumerate(train["steps"]):
        assert train["values"]["l2"][i] == float(trial.tensor(GRAD).reduction_value(step, "l2", TRAIN))
    # raw-only tensors get reductions computed from their values; one-element ones their value
    weight = plugin.series_impl(["exp1/runA"], WEIGHT, mode=EVAL)["runs"][0]["modes"]
    assert list(weight) == ["EVAL"] and weight["EVAL"]["global_steps"] == [6, 7]
    assert weight["EVAL"]["values"]["max"][0] == float(trial.tensor(WEIGHT).value(0, EVAL).max())
    loss = plugin.series_impl(["exp1/runA"], LOSS)["runs"][0]["modes"]
    assert list(loss["TRAIN"]["values"]) == ["value"] and len(loss["EVAL"]["steps"]) == 2


def test_long_series_are_whole_unless_downsampling_is_asked_for(plugin):
    full = plugin.series_impl(["runLong"], "long")["runs"][0]["modes"]["GLOBAL"]
    assert full["steps"] == list(range(1200)) and "downsampled" not in full
    thin = plugin.series_impl(["runLong"], "long", max_points=100)["runs"][0]["modes"]["GLOBAL"]
    assert len(thin["steps"]) == 100 and thin["steps"][0] == 0 and thin["steps"][-1] == 1199
    assert thin["downsampled"] == {"total": 1200, "returned": 100}


def test_runs_overlay_and_workers_split(plugin):
    both = plugin.series_impl(["exp1/runA", "runW"], "w")
    assert [r.get("missing", False) for r in both["runs"]] == [True, False]
    split = plugin.series_impl(["runW"], "w", per_worker=True)["runs"][0]["modes"]["GLOBAL"]
    assert split["workers"]["worker_0"]["values"]["mean"] == [2.0, 4.0, 6.0, 8.0]
    assert split["workers"]["worker_1"]["values"]["mean"] == [12.0, 14.0, 16.0, 18.0]
    one = plugin.series_impl(["runW"], "w", worker="worker_1")["runs"][0]["modes"]["GLOBAL"]
    assert one["values"]["mean"] == [12.0, 14.0, 16.0, 18.0]


def test_histograms_and_value_table(logdir, plugin):
    trial = create_trial(str(logdir / "exp1" / "runA"))
    h = plugin.histograms_impl("exp1/runA", WEIGHT, TRAIN)
    assert h["steps"] == [0, 1, 2, 3, 4, 5]
    for step, buckets in zip(h["steps"], h["histograms"]):
        value = trial.tensor(WEIGHT).value(step, TRAIN)
        assert len(buckets) == views.DEFAULT_HISTOGRAM_BINS and sum(b[2] for b in buckets) == value.size
        assert buckets[0][0] == float(value.min()) and buckets[-1][1] == float(value.max())
    assert plugin.histograms_impl("exp1/runA", WEIGHT, TRAIN, max_steps=2)["downsampled"] == {"total": 6, "returned": 2}
    assert "unavailable" in plugin.histograms_impl("exp1/runA", GRAD, TRAIN)  # reductions only
    table = plugin.value_impl("exp1/runA", WEIGHT, 3, TRAIN)
    assert table["shape"] == [8, 4] and not table["truncated"]
    assert np.array_equal(np.array(table["values"], dtype=np.float32), trial.tensor(WEIGHT).value(3, TRAIN))
    assert views.value_table.__name__ and views.MAX_TABLE_ELEMENTS >= 32
    with pytest.raises(errors.NotFoundError):
        plugin.value_impl("exp1/runA", GRAD, 3, TRAIN)  # only reductions at that step


def test_big_tensors_get_a_marked_preview(tmp_path):
    write_trial(tmp_path / "big", {0: {"big": np.arange(20_000, dtype=np.int32)}})
    p = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[str(tmp_path / "big")])
    table = p.value_impl("big", "big", 0, ModeKeys.GLOBAL)
    assert table["truncated"] and table["size"] == 20_000 and table["preview"] == list(range(views.PREVIEW_ELEMENTS))


def test_collections_and_rules_panels(plugin):
    colls = {c["name"]: c for c in plugin.collections_impl("exp1/runA")["collections"]}
    grads = colls["gradients"]
    assert grads["tensors"] == sorted(t for t in grads["tensors"]) and GRAD in grads["tensors"]
    assert grads["reduction_config"]["save_raw_tensor"] is False
    assert "l2" in grads["reduction_config"]["reductions"] + grads["reduction_config"]["mltrace_reductions"]
    assert grads["save_config"]["TRAIN"]["save_interval"] == 1 and grads["include_regex"]
    assert colls["losses"]["save_histogram"] is False
    answer = plugin.rules_impl("exp1/runA")
    rules = answer["rules"]
    assert [r["rule"] for r in rules] == ["LossNotDecreasing", "VanishingGradient"]  # findings first
    fired = rules[0]["history"][0]
    assert rules[0]["status"] == fired["status"] == "IssuesFound" and fired["fired_count"] == 2
    assert fired["fired"] == [{"step": 3, "mode": "TRAIN", "mode_step": 3}, {"step": 4, "mode": "TRAIN", "mode_step": 4}]
    assert fired["parameters"] == {"num_steps": 3, "mode": "TRAIN"}
    assert fired["mlflow_url"] == f"{MLFLOW_URL}/#/experiments/7/runs/abc123?workflowType=machine_learning"  # as recorded
    assert answer["mlflow"] == {"base": None, "command": None}
    assert rules[1]["history"][0]["mlflow_url"] is None
    assert rules_view.mlflow_link("sqlite:///mlflow.db", "1", "r") is None
    override = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[plugin._roots[0]], mlflow_uri="https://ui.example/")
    assert override.rules_impl("exp1/runA")["rules"][0]["history"][0]["mlflow_url"] == (
        "https://ui.example/#/experiments/7/runs/abc123?workflowType=machine_learning")


def test_warm_series_read_no_step_again(plugin, monkeypatch):
    plugin.series_impl(["runLong"], "long")
    calls = []
    monkeypatch.setattr(analysis_series, "step_statistics", lambda *a: calls.append(a) or {})
    plugin.series_impl(["runLong"], "long")
    assert calls == []


# -- routes inside TensorBoard's app -------------------------------------------------------------
@pytest.fixture(scope="module")
def client(logdir):
    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(argv=[None, "--logdir", str(logdir / "exp1"), f"--{metadata.LOGDIR_FLAG}", str(logdir)])
    multi = multiplexer.EventMultiplexer()
    multi.AddRunsFromDirectory(str(logdir / "exp1"))
    multi.Reload()
    provider = tb_data_provider.MultiplexerDataProvider(multi, str(logdir / "exp1"))
    app = application.TensorBoardWSGIApp(tb.flags, default.get_plugins(), provider)
    return werkzeug_test.Client(app, wrappers.Response)


def _get(client, route, **params):
    response = client.get(f"/data/plugin/{metadata.PLUGIN_NAME}/{route}", query_string=params)
    return response.status_code, response


def test_routes_answer_json_and_serve_the_frontend(client):
    listing = json.loads(client.get("/data/plugins_listing").get_data())[metadata.PLUGIN_NAME]
    assert listing["enabled"] and listing["tab_name"] == "mltrace"
    assert listing["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/mltrace/index.js"}
    code, r = _get(client, "index.js")
    assert code == 200 and r.mimetype == "text/javascript" and b"export async function render" in r.get_data()
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    code, r = _get(client, "static/style.css")
    assert code == 200 and r.mimetype == "text/css"
    code, r = _get(client, "runs")
    assert code == 200 and [x["name"] for x in json.loads(r.get_data())["runs"]] == ["exp1/runA", "runLong", "runW"]
    code, r = _get(client, "series", run=["exp1/runA", "runW"], tensor=LOSS, mode="train", max_points="3")
    body = json.loads(r.get_data())
    assert code == 200 and body["runs"][0]["modes"]["TRAIN"]["downsampled"] == {"total": 6, "returned": 3}
    for route, params in (("run", {"run": "runW"}), ("collections", {"run": "runW"}), ("rules", {"run": "exp1/runA"}),
                          ("histograms", {"run": "runW", "tensor": "w", "mode": "GLOBAL", "bins": "5"}),
                          ("value", {"run": "runW", "tensor": "w", "step": "1", "mode": "GLOBAL", "worker": "worker_1"})):
        code, r = _get(client, route, **params)
        assert code == 200 and r.mimetype == "application/json", (route, r.get_data())
    assert json.loads(_get(client, "value", run="runW", tensor="w", step="1", mode="GLOBAL",
                           worker="worker_1")[1].get_data())["values"] == [12.0, 14.0, 16.0]


@pytest.mark.parametrize("route", [
    "static/../plugin.py", "static/%2e%2e/plugin.py", "static/..%2fplugin.py", "static/..\\plugin.py",
    "static//etc/passwd", "static/%2Fetc%2Fpasswd", "static/", "static/index.js%00.css", "static/discovery.py",
])
def test_static_route_serves_only_its_own_files(client, route):
    response = client.get(f"/data/plugin/{metadata.PLUGIN_NAME}/{route}")
    assert response.status_code == 404 and b"import" not in response.get_data()


@pytest.mark.parametrize("params,code", [
    ({"run": "../../../etc"}, 404), ({"run": "/etc/passwd"}, 404), ({"run": "exp1/runA/../../runW"}, 404),
    ({"run": "<script>alert(1)</script>"}, 404), ({}, 400),
])
def test_runs_are_looked_up_by_name_never_as_paths(client, params, code):
    status, r = _get(client, "collections", **params)
    assert status == code and "error" in json.loads(r.get_data())
    assert "root:" not in r.get_data(as_text=True)


@pytest.mark.parametrize("route,params,code", [
    ("series", {"run": "runW", "tensor": "../../index/000000000"}, 404),
    ("series", {"run": "runW", "tensor": "w", "worker": "../w"}, 404),
    ("series", {"run": "runW", "tensor": "w", "mode": "TRAINING"}, 400),
    ("series", {"run": "runW", "tensor": "w", "max_points": "1"}, 400),
    ("series", {"tensor": "w"}, 400),
    ("value", {"run": "runW", "tensor": "w", "step": "x", "mode": "GLOBAL"}, 400),
    ("value", {"run": "runW", "tensor": "w", "step": "-1", "mode": "GLOBAL"}, 400),
    ("value", {"run": "runW", "tensor": "w", "step": "99", "mode": "GLOBAL"}, 404),
    ("histograms", {"run": "runW", "tensor": "w", "mode": "GLOBAL", "bins": "100000"}, 400),
])
def test_crafted_parameters_answer_4xx(client, route, params, code):
    status, r = _get(client, route, **params)
    assert status == code, r.get_data()
    assert "error" in json.loads(r.get_data())


# -- entry point -----------------------------------------------------------------------------------
def test_entry_point_is_registered_and_imports_light():
    assert loader.MltracePluginLoader in default.get_dynamic_plugins()
    code = ("import sys, mltrace_tb.loader; heavy = [m for m in ('mltrace', 'numpy', 'torch', 'mlflow') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_broken_dependency_leaves_tensorboard_running(monkeypatch, caplog, logdir):
    monkeypatch.setitem(sys.modules, "mltrace_tb.plugin", None)  # importing it now raises ImportError
    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(argv=[None, "--logdir", str(logdir / "plain")])
    assert loader.MltracePluginLoader().load(base_plugin.TBContext(flags=tb.flags)) is None
    assert "mltrace TensorBoard plugin disabled" in caplog.text
    app = application.TensorBoardWSGIApp(tb.flags, default.get_plugins(),
                                         tb_data_provider.MultiplexerDataProvider(multiplexer.EventMultiplexer(), ""))
    listing = json.loads(werkzeug_test.Client(app, wrappers.Response).get("/data/plugins_listing").get_data())
    assert metadata.PLUGIN_NAME not in listing and "scalars" in listing
    with pytest.raises(base_plugin.FlagsError):
        tb2 = program.TensorBoard(plugins=default.get_plugins())
        tb2.configure(argv=[None, "--logdir", "x", f"--{metadata.MLFLOW_FLAG}", "file:///x"])
        loader.MltracePluginLoader().fix_flags(tb2.flags)


# -- mltrace tensorboard ---------------------------------------------------------------------------
def test_launch_points_tensorboard_at_exports_only(logdir, tmp_path):
    one = launch.build_launch(str(logdir / "exp1" / "runA"))
    assert one.argv[:2] == ["--logdir", str(logdir / "exp1" / "runA" / "tensorboard")]
    assert one.argv[one.argv.index(f"--{metadata.LOGDIR_FLAG}") + 1] == str(logdir / "exp1" / "runA")
    assert "--samples_per_plugin" in one.argv and not one.stub_tensorflow and not one.env
    many = launch.build_launch(str(logdir), ["--port", "7000", "--samples_per_plugin", "histograms=0"])
    farm = many.argv[1]
    try:
        assert sorted(os.listdir(farm)) == ["exp1"] and os.listdir(os.path.join(farm, "exp1")) == ["runA"]
        assert os.path.realpath(os.path.join(farm, "exp1", "runA")) == os.path.realpath(
            logdir / "exp1" / "runA" / "tensorboard")  # only runA has an export; nothing links into a trial
        assert many.argv.count("--samples_per_plugin") == 1
        assert many.argv[-4:] == ["--port", "7000", "--samples_per_plugin", "histograms=0"]
    finally:
        for folder in many.cleanup:
            launch.shutil.rmtree(folder, True)
    with pytest.raises(Exception, match="no mltrace trial"):
        launch.build_launch(str(logdir / "plain"))


def test_launch_on_an_object_store(logdir):
    from tests.support.memory_storage import MemoryStorage

    register_scheme("memtb", MemoryStorage)
    for name in ("a", "b"):
        store = MemoryStorage(f"memtb://bucket/exp/{name}")
        store.write(paths.collections_file_key("worker_0"), b'{"collections": {}}')
    remote = launch.build_launch("memtb://bucket/exp", environ={"AWS_ENDPOINT_URL": "http://127.0.0.1:8333"})
    assert remote.stub_tensorflow and remote.env == {"S3_ENDPOINT": "http://127.0.0.1:8333"}
    assert "--load_fast=false" in remote.argv
    spec = remote.argv[remote.argv.index("--logdir_spec") + 1]
    assert spec == "a:memtb://bucket/exp/a/tensorboard,b:memtb://bucket/exp/b/tensorboard"
    assert [r.name for r in discovery.discover(["memtb://bucket/exp"], None)] == ["a", "b"]


def test_cli_prints_the_command(logdir, capsys):
    from mltrace.cli import main

    assert main(["tensorboard", "--print-command", str(logdir / "exp1" / "runA"), "--port", "7001"]) == 0
    out = capsys.readouterr().out
    assert "-m mltrace_tb.launch --logdir" in out and out.strip().endswith("--port 7001")
    assert main(["tensorboard", "--print-command", str(logdir / "plain")]) == 2


def test_print_command_leaves_no_temporary_folder(logdir, tmp_path):
    # Several trials once made a link folder that --print-command kept; one trial with no
    # export an empty one. A real process, its temporary folders pointed at an empty folder.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    for target in (logdir, logdir / "runLong"):
        done = subprocess.run([sys.executable, "-m", "mltrace.cli", "tensorboard", "--print-command",
                               str(target)], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert os.listdir(tmp) == [], (target, done.stdout)
    assert f"--logdir {logdir / 'runLong' / 'tensorboard'} " in done.stdout  # the hook's export folder
    many = launch.build_launch(str(logdir), make_folders=False)
    assert many.cleanup == [] and "--logdir" not in many.argv
    spec = many.argv[many.argv.index("--logdir_spec") + 1]
    assert spec == ",".join(f"{name.replace('/', '_')}:{logdir / name / 'tensorboard'}"
                            for name in ("exp1/runA", "runLong", "runW"))


def test_hook_export_and_plugin_share_one_trial(tmp_path):
    # The default export location is what the plugin and the launcher look for.
    hook = smd.Hook(out_dir=str(tmp_path / "t"), export_tensorboard=True)
    assert hook.tensorboard_dir == str(tmp_path / "t") + "/" + paths.TENSORBOARD_DIR
    hook.close()


@pytest.mark.parametrize("value", [
    np.random.default_rng(2).normal(size=100).astype(np.float32), np.arange(10, dtype=np.int8),
    np.array([1.0, np.nan, np.inf, -np.inf]), np.random.default_rng(3).normal(size=7).astype(np.float16),
    np.array([True, False, True]), np.array([1 + 2j, 3 - 1j]),
])
def test_raw_reductions_follow_mltraces_definitions(value):
    from mltrace.reductions import compute

    got = views.raw_reductions(value)
    for name in views.RAW_REDUCTIONS:
        want = float(np.real(compute(name, value)))
        assert got[name] == want or (np.isnan(got[name]) and np.isnan(want)), name
