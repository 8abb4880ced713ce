"""The diagnosis view of the mltrace tab (tb_plugin/diagnosis_view.py, the ``/diagnosis`` route):
on a real trial (the small GPT of tests/diagnosis trained with a fault injected) the route answers
what ``diagnose`` finds, computed once and never written into the trial; a report the trial keeps
is answered instead, bounded in size; a live trial's is recomputed as steps come in. The view's
data logic in the browser (tb_plugin/static/diagnosis_data.js) is tested with node's runner
(tests/tb_plugin/js/). The browser itself: test_tb_diagnosis_browser.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tensorboard import default, program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider as tb_data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer as multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from mltrace.diagnosis import diagnose
from mltrace.diagnosis.stored import read_reports, report_key, save_report
from mltrace.format import paths
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from mltrace_tb import diagnosis_view, metadata
from mltrace_tb.plugin import MltracePlugin
from tests.diagnosis.test_diagnose import poisoned_samples, train
from tests.support.tb_trials import (
    end_live,
    make_torch_trial,
    make_worker_trial,
    start_live,
    write_live_steps,
)

ROOT = Path(__file__).resolve().parents[2]


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def _reference(path: str) -> dict:
    """What ``mltrace diagnose --json`` says of the trial, as the view bounds it (JSON round trip)."""
    return json.loads(json.dumps(diagnosis_view.bounded_report(diagnose(create_trial(path)).to_dict())))


def _huge_report(worker: str) -> dict:
    """A stored report far over every bound, with a field the schema does not have."""
    evidence = [{"cause": "data", "supports": i % 2 == 0, "text": f"observation {i}"} for i in range(300)]
    return {"schema": "mltrace.diagnosis/1", "trial": "t", "worker": worker, "found": True, "message": "m" * 5000,
            "steps": {"count": 9, "first": 0, "last": 8}, "anomaly": {"step": 2, "kind": "loss_spike", "tensor": "w", "detail": "d"},
            "anomalies": [], "onset": 2,
            "origin": [{"tensor": f"t{i}", "layer": None, "step": 2, "phase": "loss", "z": "inf", "value": 1.0,
                        "window_median": 0.5} for i in range(500)],
            "origin_layer": None,
            "cause": {"class": "data", "summary": "s", "evidence": evidence, "advice": ["a"] * 100},
            "samples": [{"index": i, "loss": 9.0, "batch_median": 1.0, "fingerprint": f"{i:016x}"} for i in range(1000)],
            "record_next": [], "method": {"window": 50}, "damaged": [],
            "extra": "x" * 1_000_000, "nested": [[[[[["deep"]]]]]]}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """Trials of real training: a poisoned batch at step 70 (stability and samples recorded), a
    copy of it that keeps its diagnosis as a hook does after a dump, a short healthy run, and a
    run of two workers whose stored reports are oversized (one of them damaged)."""
    root = tmp_path_factory.mktemp("diagnosis_view")
    exp = root / "exp"
    train(exp / "poisoned", poisoned_samples, collections=("stability", "samples"))
    shutil.copytree(exp / "poisoned", exp / "kept")
    save_report(open_storage(str(exp / "kept")), diagnose(create_trial(str(exp / "kept"))))
    make_torch_trial(exp / "short")
    make_worker_trial(exp / "workers")
    storage = open_storage(str(exp / "workers"))
    quiet = {**_huge_report("worker_0"), "found": False, "message": "no anomaly in 4 steps", "anomaly": None}
    for report in (quiet, _huge_report("worker_1")):
        storage.write(report_key(report["worker"]), json.dumps(report).encode())
    storage.write(report_key("worker_9"), b"{not json")
    (root / "tb").mkdir()  # TensorBoard's own logdir: nothing (a trial's events/ is never one)
    return root


@pytest.fixture(scope="module")
def client(logdir):
    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(argv=[None, "--logdir", str(logdir / "tb"), f"--{metadata.LOGDIR_FLAG}", str(logdir / "exp")])
    multi = multiplexer.EventMultiplexer()
    provider = tb_data_provider.MultiplexerDataProvider(multi, str(logdir / "tb"))
    app = application.TensorBoardWSGIApp(tb.flags, default.get_plugins(), provider)
    return werkzeug_test.Client(app, wrappers.Response)


@pytest.fixture
def computations(monkeypatch):
    """Every diagnosis the view computes, by trial path."""
    calls: list[str] = []

    def counted(trial, *args, **kwargs):
        calls.append(trial.path)
        return diagnose(trial, *args, **kwargs)

    monkeypatch.setattr(diagnosis_view, "diagnose", counted)
    return calls


def _get(client, **params) -> tuple[int, dict, int]:
    response = client.get(f"/data/plugin/{metadata.PLUGIN_NAME}/diagnosis", query_string=params)
    body = response.get_data()
    return response.status_code, json.loads(body), len(body)


def test_a_trial_without_a_kept_report_is_diagnosed_on_request_once_and_never_written(
        logdir, client, computations):
    trial = logdir / "exp" / "poisoned"
    before = _files(trial)
    code, answer, _ = _get(client, run="poisoned")
    assert code == 200, answer
    assert answer["source"] == "computed" and answer["stored_workers"] == [] and answer["error"] is None
    expected = _reference(str(trial))
    assert answer["diagnosis"] == expected
    assert expected["found"] and expected["cause"]["class"] and expected["origin"]  # the fault is found
    assert answer["diagnosis"]["left_out"] == {}
    # a refresh, and the panel's next poll, answer the same without reading the trial again
    assert _get(client, run="poisoned")[1] == answer and _get(client, run="poisoned")[1] == answer
    assert computations == [str(trial)]
    assert _files(trial) == before and not (trial / paths.DIAGNOSIS_DIR).exists()  # read only


def test_a_kept_report_is_answered_as_kept(logdir, client, computations):
    code, answer, _ = _get(client, run="kept")
    assert code == 200 and answer["source"] == "stored" and answer["stored_workers"] == ["worker_0"]
    kept = read_reports(open_storage(str(logdir / "exp" / "kept")))[0]
    assert answer["diagnosis"] == json.loads(json.dumps(diagnosis_view.bounded_report(kept)))
    assert answer["diagnosis"]["message"] == kept["message"] and answer["diagnosis"]["found"] == kept["found"]
    assert computations == []  # nothing computed beside a kept report


def test_kept_reports_are_chosen_by_worker_and_bounded_in_size(logdir, client, computations, caplog):
    source = sum(len(p.read_bytes()) for p in (logdir / "exp" / "workers" / paths.DIAGNOSIS_DIR).iterdir())
    assert source > 2_000_000
    code, answer, size = _get(client, run="workers")
    assert code == 200 and "damaged diagnosis" in caplog.text  # worker_9's file is skipped
    assert answer["stored_workers"] == ["worker_0", "worker_1"]
    d = answer["diagnosis"]
    assert d["worker"] == "worker_1" and d["found"]  # the one that found something, by default
    assert size < 64_000
    assert len(d["origin"]) == 10 and len(d["samples"]) == 50 and len(d["cause"]["evidence"]) == 40
    assert len(d["cause"]["advice"]) == 10 and len(d["message"]) == diagnosis_view.MAX_TEXT
    assert d["left_out"] == {"origin": 490, "samples": 950, "cause.evidence": 260, "cause.advice": 90}
    assert "extra" not in d and "nested" not in d
    assert set(d) == set(diagnosis_view.FIELDS) | {"left_out"}
    code, answer, _ = _get(client, run="workers", worker="worker_0")
    assert answer["diagnosis"]["worker"] == "worker_0" and not answer["diagnosis"]["found"]
    assert computations == []


def test_a_trial_with_no_anomaly_says_so_with_the_thresholds(logdir, client):
    code, answer, _ = _get(client, run="short")
    assert code == 200 and answer["source"] == "computed"
    d = answer["diagnosis"]
    assert d == _reference(str(logdir / "exp" / "short"))
    assert not d["found"] and d["cause"] is None and d["onset"] is None
    assert d["message"].startswith("no anomaly in 8 steps") and "robust z >= 8" in d["message"]


def test_the_views_modules_are_served(client):
    for name in ("diagnosis.js", "diagnosis_data.js"):
        response = client.get(f"/data/plugin/{metadata.PLUGIN_NAME}/static/{name}")
        assert response.status_code == 200 and response.mimetype == "text/javascript"
        assert b"export function" in response.get_data()


@pytest.mark.parametrize("params,code", [({}, 400), ({"run": "../exp/poisoned"}, 404), ({"run": "nothing"}, 404)])
def test_the_route_looks_runs_up_by_name(client, params, code):
    status, answer, _ = _get(client, **params)
    assert status == code and "error" in answer


def test_a_failing_diagnosis_is_an_answer_not_a_crash(logdir, monkeypatch, caplog):
    def broken(trial, *args, **kwargs):
        raise ValueError("a table of no steps")

    monkeypatch.setattr(diagnosis_view, "diagnose", broken)
    plugin = MltracePlugin(base_plugin.TBContext(logdir=None), mltrace_logdirs=[str(logdir / "exp")])
    route = werkzeug_test.Client(plugin.get_plugin_apps()["/diagnosis"], wrappers.Response)
    response = route.get("/", query_string={"run": "short"})
    answer = json.loads(response.get_data())
    assert response.status_code == 200 and answer["diagnosis"] is None and answer["source"] == "computed"
    assert answer["error"] == "the diagnosis failed: ValueError: a table of no steps"
    assert "diagnosis of" in caplog.text and "a table of no steps" in caplog.text
    # a kept report needs no computation
    assert plugin.diagnosis_impl("workers")["diagnosis"]["worker"] == "worker_1"


def test_a_live_trial_is_diagnosed_again_as_steps_come_in(tmp_path, monkeypatch, computations):
    path = tmp_path / "exp" / "live"
    start_live(tmp_path, path)
    write_live_steps(tmp_path, range(3), ["gradient/a"])
    plugin = MltracePlugin(base_plugin.TBContext(logdir=None), mltrace_logdirs=[str(tmp_path / "exp")])
    assert plugin.diagnosis_impl("live")["diagnosis"]["message"].startswith("no anomaly in 3 steps")
    write_live_steps(tmp_path, range(3, 6), ["gradient/a"])
    # within LIVE_REUSE_S of the last computation a live trial's report is reused
    assert plugin.diagnosis_impl("live")["diagnosis"]["message"].startswith("no anomaly in 3 steps")
    assert len(computations) == 1
    monkeypatch.setattr(diagnosis_view, "LIVE_REUSE_S", 0.0)
    assert plugin.diagnosis_impl("live")["diagnosis"]["message"].startswith("no anomaly in 6 steps")
    assert plugin.diagnosis_impl("live")["diagnosis"]["message"].startswith("no anomaly in 6 steps")
    assert len(computations) == 2  # the same steps: not again
    end_live(tmp_path)
    assert plugin.diagnosis_impl("live")["diagnosis"]["message"].startswith("no anomaly in 6 steps")
    assert len(computations) == 3  # training ended: once more, then kept
    plugin.diagnosis_impl("live")
    assert len(computations) == 3 and not (path / paths.DIAGNOSIS_DIR).exists()


def test_the_diagnosis_views_data_logic_with_node_test_runner():
    node = shutil.which("node")
    assert node, "node (20 or later) is needed for the frontend's unit tests: apt-get install nodejs"
    files = sorted(str(p) for p in (ROOT / "tests" / "tb_plugin" / "js").glob("*.test.mjs"))
    assert files
    done = subprocess.run([node, "--test", *files], capture_output=True, text=True, cwd=ROOT, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "# fail 0" in out and "# pass 0" not in out, out[-2000:]
