"""Run against run: the difference view (``/difference``, ``mltrace.analysis.difference``) on
trials the PyTorch hook wrote: a 100-layer MLP, the same MLP with one layer's weights made 1.5
times larger just before step 8, and a rerun of the plain one. The view is the ratio of each
tensor's statistic to the first run's at the same step; where two runs part ways is the first
step and tensor where that ratio leaves 1. The tab's data logic: tests/tb_plugin/js/
difference_data.test.mjs (run here); the browser: test_tb_overview_depth_browser.py."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tensorboard import errors
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from mltrace.analysis.difference import difference_heatmap
from mltrace.analysis.parting import find_parting, first_difference, ratio_values
from mltrace.trials import create_trial
from mltrace_tb.plugin import MltracePlugin
from tests.tb_plugin.test_tb_overview_depth import LINEAR, make_mlp_trial

ROOT = Path(__file__).resolve().parents[2]
#: The layer made to differ (Linear 60 of 101: ``Sequential_120``) and the step it was changed at.
BUMP = (60, 8)
BUMPED = f"Sequential_{2 * BUMP[0]}.weight"
STEPS = 12


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("difference")
    make_mlp_trial(root / "mlp", steps=STEPS)
    make_mlp_trial(root / "bumped", steps=STEPS, bump=BUMP)
    make_mlp_trial(root / "rerun", steps=STEPS)
    return root


@pytest.fixture(scope="module")
def plugin(root):
    return MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[str(root)])


def _cells(row: dict) -> list[float | None]:
    return row["high"]


def test_the_layer_made_to_differ_is_where_the_runs_part_ways(plugin):
    answer = plugin.difference_impl("bumped", "mlp", collection="weights")
    assert answer["against"] == "mlp" and answer["normalize"] == "ratio" and answer["complete"]
    parting = answer["parting"]
    assert (parting["step"], parting["tensor"]) == (BUMP[1], BUMPED)
    assert parting["ratio"] == pytest.approx(1.5, rel=1e-5)
    assert parting["value"] == pytest.approx(1.5 * parting["reference_value"], rel=1e-5)
    assert parting["others"] == []  # no other weight differs at that step
    rows = {r["tensor"]: r for r in answer["rows"]}
    assert list(rows)[:2] == ["Sequential_0.weight", "Sequential_2.weight"]  # model order
    assert len(rows) == LINEAR
    assert answer["starts"] == list(range(STEPS))  # one column a step: 12 steps, 400 columns
    # ×1 in every layer before the change; the changed layer ×1.5 from it; the others still ×1
    # at that step (their weights change one optimizer step later, by far less than 0.1%)
    for name, row in rows.items():
        assert row["low"][:BUMP[1]] == [1.0] * BUMP[1], name
        if name != BUMPED:
            assert row["high"][BUMP[1]] == pytest.approx(1.0, abs=1e-3), name
    assert rows[BUMPED]["low"][BUMP[1]] == pytest.approx(1.5, rel=1e-4)
    json.dumps(answer, allow_nan=False)  # strict JSON


def test_a_rerun_agrees_everywhere(plugin):
    answer = plugin.difference_impl("rerun", "mlp", collection="gradients")
    assert answer["parting"] is None and answer["complete"]
    assert {v for r in answer["rows"] for v in r["low"] + r["high"]} == {1.0}


def test_gradients_part_ways_at_the_same_step_in_many_tensors(plugin):
    """A changed layer changes every gradient of its step (the loss moved): the step is the
    same, the tensor named is the one that moved most, the others are listed."""
    answer = plugin.difference_impl("bumped", "mlp", collection="gradients", statistic="abs_max")
    parting = answer["parting"]
    assert parting["step"] == BUMP[1] and parting["tensor"].startswith("gradient/")
    assert len(parting["others"]) == 20  # capped: 201 other gradients differ there too


def test_bad_arguments_name_the_value(plugin):
    with pytest.raises(errors.InvalidArgumentError, match="'bogus'"):
        plugin.difference_impl("bumped", "mlp", statistic="bogus")
    with pytest.raises(errors.InvalidArgumentError, match="no collection 'nope'"):
        plugin.difference_impl("bumped", "mlp", collection="nope")
    with pytest.raises(errors.NotFoundError, match="'ghost'"):
        plugin.difference_impl("bumped", "ghost")


def test_the_route(plugin):
    app = plugin.get_plugin_apps()["/difference"]
    client = werkzeug_test.Client(app, wrappers.Response)
    body = json.loads(client.get("/", query_string={"run": "bumped", "against": "mlp", "collection": "weights",
                                                    "columns": "4", "filter": "Sequential_12"}).get_data())
    assert len(body["starts"]) == 4
    assert [r["tensor"] for r in body["rows"]] == ["Sequential_12.weight", "Sequential_120.weight",
                                                   "Sequential_122.weight", "Sequential_124.weight",
                                                   "Sequential_126.weight", "Sequential_128.weight"]
    assert body["parting"]["tensor"] == BUMPED
    assert client.get("/", query_string={"run": "bumped"}).status_code == 400  # no against


def test_an_unfinished_read_names_no_parting(root):
    """Under a deadline that has passed, the answer is a coarse picture and names no parting:
    the runs might part ways in a step not read yet."""
    a, b = create_trial(str(root / "mlp")), create_trial(str(root / "bumped"))
    names = a.tensor_names(collection="weights")
    found = difference_heatmap(b, a, names, "l2", deadline=0.0)
    assert not found.heatmap.complete and found.parting is None
    assert difference_heatmap(b, a, names, "l2").parting.panel == BUMPED


def test_ratios_and_the_first_difference():
    a = np.array([1.0, 0.0, 0.0, math.inf, math.nan, math.nan, 2.0])
    b = np.array([1.5, 0.0, 3.0, math.inf, math.nan, 1.0, -2.0])
    out = ratio_values(a, b)
    assert out[:4].tolist() == [1.5, 1.0, math.inf, 1.0] and math.isnan(out[5]) and out[6] == -1.0
    assert out[4] == 1.0  # two NaNs agree
    # an infinity differs from any number (a relative tolerance of an infinity would hide it)
    assert first_difference(([0], [1.0]), ([0], [math.inf])) == (0, 1.0, math.inf)
    assert first_difference(([0], [math.inf]), ([0], [math.inf])) is None
    assert first_difference(([0], [math.nan]), ([0], [math.nan])) is None
    assert first_difference(([0, 1, 2], [1.0, 1.0, 1.0]), ([1, 2, 3], [1.0, math.inf, 0.0])) == (2, 1.0, math.inf)
    assert first_difference(([0, 1], [1.0, 1.0]), ([0, 1], [1.0, 1.0005])) is None  # within 0.1%
    assert first_difference(([0, 1], [1.0, 1.0]), ([5, 6], [9.0, 9.0])) is None  # no step in common
    series = {"x": {"a": ([0, 1, 2], [1, 1, 1]), "b": ([0, 1, 2], [1, 1, 2])},
              "y": {"a": ([0, 1, 2], [1, 1, 1]), "b": ([0, 1, 2], [1, 1, 1.5])},
              "z": {"a": ([0, 1, 2], [1, 1, 1])}}
    parting = find_parting(series, ("a", "b"))
    assert (parting.step, parting.panel, parting.others) == (2, "x", ["y"])


def test_the_difference_views_data_logic_with_node():
    node = shutil.which("node")
    assert node, "node (20 or later) is needed for the frontend's unit tests: apt-get install nodejs"
    done = subprocess.run([node, "--test", "tests/tb_plugin/js/difference_data.test.mjs"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
