"""Rule findings on the mltrace tab, backend: a finding marks exactly the tensors its message names
(``gradient/X`` is not ``X``) and every step its rule fired (300 steps end at the 300th, thinned
evenly past MAX_MARKED_STEPS and said so, never cut); the Rules panel gives where its message names
each tensor (the links), lists the trial's non-finite values with no rule run, and links MLflow
only where a result recorded its page. The panel's data logic (static/rules_data.js) runs under
node's test runner. The browser: test_tb_findings_browser.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tensorboard.plugins import base_plugin

from mltrace.format import paths
from mltrace.rules.results import ISSUES_FOUND, RuleResult
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from mltrace_tb import nonfinite_view, rules_view
from mltrace_tb.mentions import mentions, named_tensors
from mltrace_tb.plugin import MltracePlugin
from tests.support.rule_trials import red, write_trial

ROOT = Path(__file__).resolve().parents[2]
GRAD_B = "gradient/Sequential_0.bias"
BIAS = "Sequential_0.bias"
STEPS = 320
FIRED = list(range(10, 310))  # 300 fired steps: the last is 309, far past the old cap's 209


def _result(rule: str, fired: list[int], message: str, started: float, **kw) -> RuleResult:
    return RuleResult(rule=rule, trial="t", parameters={}, status=ISSUES_FOUND, started=started,
                      ended=started + 1, evaluated_steps=STEPS, fired_steps=fired,
                      first_step=fired[0], message=message, **kw)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("findings")
    data = {s: {GRAD_B: np.full(3, 0.1 * (s + 1)), BIAS: np.full(3, 1.0 + s),
                "gradient/Sequential_0.bias_scale": np.ones(2), "loss": np.float32(1.0 / (s + 1))}
            for s in range(STEPS)}
    path = write_trial(root / "f", data, modes={s: ("train", s) for s in range(STEPS)},
                       collections={"gradients": ["^gradient/"], "weights": ["^Sequential"]})
    storage = open_storage(path)
    for result in (
        _result("ExplodingTensor", FIRED, f"{GRAD_B} holds NaN at step 10 (TRAIN step 10)", 100.0),
        _result("WeightUpdateRatio", [40], f"{BIAS}: update/weight ratio 3.2 above 10 at step 40.", 200.0),
    ):
        storage.write(result.key, result.to_json().encode())
    return root


@pytest.fixture(scope="module")
def plugin(root):
    return MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[str(root)])


def test_a_finding_marks_only_the_tensor_it_names_and_every_fired_step(plugin):
    answer = plugin.overview_impl("f", collection="*")
    findings = {f["rule"]: f for f in answer["findings"]}
    exploding = findings["ExplodingTensor"]
    assert exploding["steps"] == FIRED and exploding["steps"][-1] == 309  # no cap at 200
    assert exploding["fired_count"] == 300 and exploding["thinned"] is False
    assert exploding["first_step"] == 10
    # the message is about the gradient: neither the parameter nor a longer name is marked
    assert exploding["tensors"] == [GRAD_B]
    assert findings["WeightUpdateRatio"]["tensors"] == [BIAS]  # "X:" closes a clause
    # only the weights shown: the gradient's finding marks none of them
    weights = plugin.overview_impl("f", collection="weights")
    assert {f["rule"]: f["tensors"] for f in weights["findings"]} == {
        "ExplodingTensor": [], "WeightUpdateRatio": [BIAS]}


def test_the_rules_panel_lists_every_fired_step_and_where_the_message_names_tensors(plugin):
    rules = {r["rule"]: r for r in plugin.rules_impl("f")["rules"]}
    newest = rules["ExplodingTensor"]["history"][0]
    assert [f["step"] for f in newest["fired"]] == FIRED and newest["fired_count"] == 300
    assert newest["fired"][-1] == {"step": 309, "mode": "TRAIN", "mode_step": 309}
    assert newest["fired_thinned"] is False and newest["first"]["step"] == 10
    assert newest["mentions"] == [[0, len(GRAD_B), GRAD_B]]
    ratio = rules["WeightUpdateRatio"]["history"][0]
    assert ratio["mentions"] == [[0, len(BIAS), BIAS]]


def test_long_firings_are_thinned_evenly_from_first_to_last(tmp_path):
    fired = list(range(0, 75_000, 3))  # 25,000 fired steps
    path = write_trial(tmp_path / "long", {s: {"w": np.ones(2)} for s in (0, fired[-1])})
    storage = open_storage(path)
    storage.write(_result("R", fired, "w grew", 1.0).key, _result("R", fired, "w grew", 1.0).to_json().encode())
    (finding,) = rules_view.findings(create_trial(path), ["w"])
    steps = finding["steps"]
    assert len(steps) == rules_view.MAX_MARKED_STEPS and finding["thinned"] is True
    assert steps[0] == 0 and steps[-1] == fired[-1] and finding["fired_count"] == 25_000
    gaps = np.diff(steps)
    assert gaps.min() >= 3 and gaps.max() <= 3 * 3  # evenly spread, no stretch left out
    assert rules_view.thinned([5, 1, 3]) == [1, 3, 5] and rules_view.thinned(list(range(7)), 3) == [0, 3, 6]


@pytest.mark.parametrize(("text", "names", "expected"), [
    (f"{GRAD_B} holds NaN", [GRAD_B, BIAS], [GRAD_B]),
    (f"{BIAS} holds NaN", [GRAD_B, BIAS], [BIAS]),
    (f"NaN in {BIAS}.", [BIAS], [BIAS]),                          # a sentence ends after it
    ("dense/kernel:0 exploded", ["dense/kernel", "dense/kernel:0"], ["dense/kernel:0"]),
    ("layer10 and layer1, then 'layer2'", ["layer1", "layer10", "layer2", "layer"], ["layer10", "layer1", "layer2"]),
    (f"{BIAS}_scale is flat", [BIAS], []),
    ("x.weight differs from 'x'", ["x", "x.weight", "weight"], ["x.weight", "x"]),
    (None, [BIAS], []),
])
def test_mentions_are_exact_names(text, names, expected):
    assert named_tensors(text, names) == expected
    for start, end, name in mentions(text, names):
        assert text is not None and text[start:end] == name


def _nan_trial(path) -> str:
    data = {}
    for s in range(12):
        loss = np.float32(np.nan if s >= 7 else 1.0 / (s + 1))
        vec = np.array([1.0, 2.0, np.nan if s == 5 else 3.0])
        data[s] = {"loss": loss, "dense_output": vec,
                   red("gradient/a", "l2"): np.inf if s >= 9 else 0.5, red("gradient/a", "max"): np.inf if s >= 9 else 0.2}
    return write_trial(path, data, modes={s: ("train", s) for s in range(12)},
                       collections={"losses": ["^loss$"], "gradients": ["^gradient/"]})


def test_nonfinite_values_show_with_no_rule_run(tmp_path):
    path = _nan_trial(tmp_path / "nan")
    plugin = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[path])
    answer = plugin.rules_impl("nan")
    assert answer["rules"] == []
    nf = answer["nonfinite"]
    assert nf["complete"] and nf["checked"] == nf["total"] == 3
    got = [(t["tensor"], t["step"], t["mode"], t["mode_step"], t["kind"], t["steps"], t["last_step"], t["source"])
           for t in nf["tensors"]]
    assert got == [("dense_output", 5, "TRAIN", 5, "NaN", 1, 5, "trial"),
                   ("loss", 7, "TRAIN", 7, "NaN", 5, 11, "trial"),
                   ("gradient/a", 9, "TRAIN", 9, "inf", 3, 11, "trial")]
    # read through one stored reduction (max before l2: it cannot overflow), raw values else
    assert nonfinite_view.probe(create_trial(path), "gradient/a") == "max"
    assert nonfinite_view.probe(create_trial(path), "loss") == nonfinite_view.RAW_PROBE


def test_nonfinite_scan_goes_on_within_a_budget(tmp_path):
    path = _nan_trial(tmp_path / "nan")
    trial = create_trial(path)
    cache = nonfinite_view.heatmap.StatisticCache()
    first = nonfinite_view.nonfinite(trial, cache, budget_s=0.0)
    assert not first["complete"] and first["checked"] < first["total"]
    later = nonfinite_view.nonfinite(trial, cache, budget_s=None)
    assert later["complete"] and [t["tensor"] for t in later["tensors"]] == ["dense_output", "loss", "gradient/a"]


def test_every_answer_gets_further_even_with_more_tensors_than_the_cache_holds(tmp_path):
    """A zero budget still reads a batch per answer, and what each tensor came to is kept apart
    from the values, so a cache smaller than the trial does not make the scan start over."""
    data = {s: {f"g{k:02d}": np.array([np.nan if (k == 37 and s == 3) else 1.0]) for k in range(40)} for s in range(5)}
    trial = create_trial(write_trial(tmp_path / "wide", data))
    cache = nonfinite_view.heatmap.StatisticCache(max_entries=2)
    answers = [nonfinite_view.nonfinite(trial, cache, budget_s=0.0) for _ in range(4)]
    assert [a["checked"] for a in answers] == [16, 32, 40, 40] and [a["complete"] for a in answers] == [False, False, True, True]
    assert [(t["tensor"], t["step"]) for t in answers[-1]["tensors"]] == [("g37", 3)]


def test_mlflow_links_only_where_a_result_recorded_one(tmp_path):
    path = write_trial(tmp_path / "m", {s: {"loss": 1.0} for s in range(3)})
    storage = open_storage(path)
    storage.write(paths.MLFLOW_RUN_FILE, json.dumps(
        {"run_id": "r1", "experiment_id": "3", "tracking_uri": "sqlite:////tmp/x/mlflow.db"}).encode())
    bare = _result("A", [1], "loss rose", 1.0, mlflow_run_id="c9", mlflow_experiment_id="3")
    recorded = _result("B", [2], "loss rose", 2.0, mlflow_run_id="d1", mlflow_experiment_id="3",
                       mlflow_url="https://mlflow.example/#/experiments/3/runs/d1")
    for result in (bare, recorded):
        storage.write(result.key, result.to_json().encode())
    answer = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[path]).rules_impl("m")
    links = {r["rule"]: r["history"][0]["mlflow_url"] for r in answer["rules"]}
    assert links == {"A": None, "B": "https://mlflow.example/#/experiments/3/runs/d1"}
    assert answer["mlflow"] == {"base": None, "command": "mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db"}
    assert ":5000" not in json.dumps(answer)
    # an http tracking URI in the trial's record is no page of the rule run: still no link
    storage.write(paths.MLFLOW_RUN_FILE, json.dumps(
        {"run_id": "r1", "experiment_id": "3", "tracking_uri": "http://127.0.0.1:5000"}).encode())
    again = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[path]).rules_impl("m")
    assert {r["rule"]: r["history"][0]["mlflow_url"] for r in again["rules"]}["A"] is None
    # the UI the plugin flag names is the user's word: links go there
    flagged = MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[path], mlflow_uri="https://ui.example/")
    assert {r["rule"]: r["history"][0]["mlflow_url"] for r in flagged.rules_impl("m")["rules"]}["A"] == (
        "https://ui.example/#/experiments/3/runs/c9?workflowType=machine_learning")
    assert "5000" not in (ROOT / "tb_plugin" / "static" / "rules.js").read_text()


def test_rules_panel_data_logic_with_node_test_runner():
    node = shutil.which("node")
    assert node, "node (20 or later) is needed for the frontend's unit tests: apt-get install nodejs"
    done = subprocess.run([node, "--test", "tests/tb_plugin/js/rules_data.test.mjs"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "# fail 0" in done.stdout, (done.stdout + done.stderr)[-4000:]
