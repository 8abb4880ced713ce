"""The Rules panel's flight recorder part: the first non-finite tensor and the dumps of each
worker, from the trial's record files, through the impl method and the ``/rules`` route inside
TensorBoard's own WSGI app. The browser sees it in test_tb_browser.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tensorboard import default, program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider as tb_data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer as multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from mltrace.format.flight_record import RECORD_DIR
from mltrace_tb import metadata
from mltrace_tb.plugin import MltracePlugin
from tests.support.flight_records import POISONED, write_records
from tests.support.rule_trials import write_trial


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fr-logs")
    steps = {s: {"w": np.full(2, float(s))} for s in range(0, 20)}
    write_records(write_trial(root / "runF", steps))
    write_trial(root / "runPlain", steps)
    return root


def test_panel_data_first_nonfinite_and_dumps(logdir):
    plugin = MltracePlugin(base_plugin.TBContext(logdir=str(logdir)), mltrace_logdirs=[str(logdir)],
                           mlflow_uri=None)
    # the record folder is part of the trial, never a run of its own
    assert [r["name"] for r in plugin.runs_impl()["runs"]] == ["runF", "runPlain"]
    fr = plugin.rules_impl("runF")["flight_recorder"]
    assert fr["first_nonfinite"]["tensor"] == POISONED
    assert (fr["first_nonfinite"]["worker"], fr["first_nonfinite"]["step"]) == ("worker_1", 12)
    assert [(d["worker"], d["trigger"], d["step"]) for d in fr["dumps"]] == [
        ("worker_0", "manual", 5), ("worker_1", "nonfinite", 12), ("worker_0", "nonfinite", 13)]
    assert fr["dumps"][1]["before"] == {"count": 10, "steps": list(range(2, 12))}
    assert fr["dumps"][1]["after"] == {"count": 3, "steps": [13, 14, 15]}
    assert fr["dumps"][2]["before"]["count"] == 400 and len(fr["dumps"][2]["before"]["steps"]) == 200
    assert fr["dumps"][1]["first_nonfinite"] == POISONED and fr["dumps"][0]["first_nonfinite"] is None
    assert plugin.rules_impl("runPlain")["flight_recorder"] == {"first_nonfinite": None, "dumps": []}


def test_rules_route_serves_the_flight_recorder(logdir):
    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(argv=[None, "--logdir", str(logdir), f"--{metadata.LOGDIR_FLAG}", str(logdir)])
    multi = multiplexer.EventMultiplexer()
    provider = tb_data_provider.MultiplexerDataProvider(multi, str(logdir))
    app = application.TensorBoardWSGIApp(tb.flags, default.get_plugins(), provider)
    client = werkzeug_test.Client(app, wrappers.Response)
    response = client.get(f"/data/plugin/{metadata.PLUGIN_NAME}/rules", query_string={"run": "runF"})
    assert response.status_code == 200 and response.mimetype == "application/json"
    body = json.loads(response.get_data())
    assert body["rules"] == [] and body["flight_recorder"]["first_nonfinite"]["tensor"] == POISONED
    assert len(body["flight_recorder"]["dumps"]) == 3
    # a damaged record is skipped, the rest still served
    (logdir / "runF" / RECORD_DIR / "worker_0.json").write_bytes(b"{damaged")
    try:
        body = json.loads(client.get(f"/data/plugin/{metadata.PLUGIN_NAME}/rules",
                                     query_string={"run": "runF"}).get_data())
        assert [d["worker"] for d in body["flight_recorder"]["dumps"]] == ["worker_1"]
    finally:
        write_records(str(logdir / "runF"))
