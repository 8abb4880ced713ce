"""Rule findings and non-finite values in the mltrace tab, end to end: ``mltrace tensorboard`` (a
real TensorBoard process on 127.0.0.1) and headless Debian Chromium. A finding's tensor is a link
that opens its detail view marked at the step the rule first fired; the overview marks exactly the
tensor a finding names; a trial whose loss turned NaN shows it in the Rules panel with no rule run;
the expanded rules tables stay inside their box; MLflow links only where a result recorded one.

Screenshots are kept in test-artifacts/ (git-ignored): tb_findings_link.png, tb_findings_detail.png,
tb_nonfinite_values.png, tb_rules_expanded.png.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from mltrace.format import paths
from mltrace.rules.results import ISSUES_FOUND, NO_ISSUES_FOUND, RuleResult
from mltrace.storage import open_storage
from tests.support.browser import headless_chromium
from tests.support.rule_trials import write_trial
from tests.tb_plugin.test_tb_browser import (
    _open_tab,
    _panel,
    _runs,
    _shot,
    mltrace_tensorboard,
)

GRAD_B = "gradient/Sequential_0.bias"
BIAS = "Sequential_0.bias"
LONG = "gradient/" + "transformer.h.0.attn.c_attn_" * 8 + "weight"  # one long unbreakable name
RECORDED = "http://127.0.0.1:5999/#/experiments/7/runs/w1?workflowType=machine_learning"
STEPS = 320
NAN_AT = 4


def _result(rule: str, started: float, fired: list[int], message: str | None, **kw) -> RuleResult:
    return RuleResult(rule=rule, trial="t", parameters=kw.pop("parameters", {}), status=kw.pop("status", ISSUES_FOUND),
                      started=started, ended=started + 3, evaluated_steps=STEPS, fired_steps=fired,
                      first_step=fired[0] if fired else None, message=message, **kw)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("findings_tb")
    data = {s: {GRAD_B: np.full(3, 0.1 * (s + 1)), BIAS: np.full(3, 1.0 + s), LONG: np.ones(2) * s,
                "loss": np.float32(1.0 / (s + 1))} for s in range(STEPS)}
    path = write_trial(root / "exp" / "findings", data, modes={s: ("train", s) for s in range(STEPS)},
                       collections={"gradients": ["^gradient/"], "weights": ["^Sequential"], "losses": ["^loss$"]})
    storage = open_storage(path)
    long_params = {"tensor_regex": ".*" + "c_attn_" * 30, "thresholds": list(range(40))}
    results = [
        _result("ExplodingTensor", 1000.0, list(range(10, 310)), f"{GRAD_B} holds NaN at step 10 (TRAIN step 10)",
                mlflow_run_id="e1", mlflow_experiment_id="7"),  # no page recorded: no link
        *[_result("WeightUpdateRatio", 900.0 + k, [40 + k], f"{LONG}: update/weight ratio 3.2 above 10 at step {40 + k}",
                  parameters=long_params, mlflow_run_id="w1", mlflow_experiment_id="7", mlflow_url=RECORDED)
          for k in range(3)],
        *[_result("UnchangedTensor", 800.0 + k, [], None, status=NO_ISSUES_FOUND, parameters=long_params)
          for k in range(3)],
    ]
    for result in results:
        storage.write(result.key, result.to_json().encode())
    storage.write(paths.MLFLOW_RUN_FILE, json.dumps({"run_id": "r1", "experiment_id": "7",
                                                     "tracking_uri": "sqlite:////tmp/none/mlflow.db"}).encode())
    write_trial(root / "exp" / "nan", {s: {"loss": np.float32(np.nan if s >= NAN_AT else 1.0 / (s + 1)),
                                           "dense.weight": np.ones(4)} for s in range(8)},
                modes={s: ("train", s) for s in range(8)}, collections={"losses": ["^loss$"]})
    return root


@pytest.fixture(scope="module")
def server(logs):
    with mltrace_tensorboard(logs, runs=2) as url:  # no TensorBoard export: the tab lists both
        yield url


@pytest.fixture(scope="module")
def browser():
    with headless_chromium(1400, 1100) as driver:
        yield driver


def _detail_at(browser, wait, tensor: str, step: int) -> None:
    """The detail view of ``tensor`` opened marked at global ``step``, its values shown there."""
    note = wait.until(lambda d: d.find_element(By.ID, "mt-marked-step"))
    assert note.get_attribute("data-step") == str(step)
    assert Select(browser.find_element(By.ID, "mt-tensor")).first_selected_option.get_attribute("value") == tensor
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-chart .uplot"))
    assert browser.find_element(By.ID, "mt-chart").get_attribute("data-marked-step") == str(step)
    assert Select(browser.find_element(By.ID, "mt-step")).first_selected_option.get_attribute("value") == str(step)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.mt-valuetable td"))
    assert f"step {step}:" in browser.find_element(By.CSS_SELECTOR, ".mt-values").text


def test_a_finding_links_its_tensor_at_its_step_and_marks_only_that_row(server, browser):
    wait = _open_tab(browser, server)
    _runs(browser, "findings")
    # the overview (all tensors): the gradient the finding names is marked, the parameter is not
    Select(browser.find_element(By.ID, "mt-ov-collection")).select_by_value("")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-rows") == "4")
    marked = {e.get_attribute("data-tensor") for e in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label.mt-marked")}
    assert marked == {GRAD_B, LONG}
    # under the overview, the finding says how often it fired and links the tensors it names
    finding = next(f for f in browser.find_elements(By.CSS_SELECTOR, ".mt-finding") if "ExplodingTensor" in f.text)
    assert "fired at 300 steps" in finding.text
    named = finding.find_elements(By.CSS_SELECTOR, "button.mt-linkbutton")
    assert [b.get_attribute("data-tensor") for b in named] == [GRAD_B]
    named[0].click()
    _detail_at(browser, wait, GRAD_B, 10)
    browser.switch_to.default_content()
    wait = _open_tab(browser, server)
    _runs(browser, "findings")
    _panel(browser, wait, "rules")
    row = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "tr[data-rule='ExplodingTensor']"))
    links = row.find_elements(By.CSS_SELECTOR, "button.mt-finding-link")
    assert [(a.get_attribute("data-tensor"), a.get_attribute("data-step")) for a in links] == [(GRAD_B, "10")]
    assert "… (300 in all)" in row.text
    # MLflow: a link only where the result recorded its page; never a guessed localhost:5000
    assert not row.find_elements(By.CSS_SELECTOR, "a.mt-mlflow") and "e1" in row.text
    ratio = browser.find_element(By.CSS_SELECTOR, "tr[data-rule='WeightUpdateRatio']")
    assert ratio.find_element(By.CSS_SELECTOR, "a.mt-mlflow").get_attribute("href") == RECORDED
    assert not [a for a in browser.find_elements(By.TAG_NAME, "a") if ":5000" in (a.get_attribute("href") or "")]
    assert "mlflow ui --backend-store-uri sqlite:////tmp/none/mlflow.db" in browser.find_element(By.CSS_SELECTOR, ".mt-mlflow-hint").text
    _shot(browser, "tb_findings_link.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    browser.find_element(By.CSS_SELECTOR, f"button.mt-finding-link[data-tensor='{GRAD_B}']").click()
    _detail_at(browser, wait, GRAD_B, 10)
    assert "ExplodingTensor's finding" in browser.find_element(By.ID, "mt-marked-step").text
    _shot(browser, "tb_findings_detail.png")


def test_a_nan_loss_shows_in_the_rules_panel_with_no_rule_run(server, browser):
    wait = _open_tab(browser, server)
    _runs(browser, "nan")
    _panel(browser, wait, "rules")
    box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-nonfinite-values[data-complete='1']"))
    assert "mt-nonfinite-found" in box.get_attribute("class")
    assert "Non-finite values: 1 tensor held a NaN or an infinity" in box.text
    rows = box.find_elements(By.CSS_SELECTOR, "tr[data-tensor]")
    assert [(r.get_attribute("data-tensor"), r.get_attribute("data-step")) for r in rows] == [("loss", str(NAN_AT))]
    assert f"{NAN_AT} (TRAIN {NAN_AT})" in rows[0].text and "NaN" in rows[0].text and "4" in rows[0].text
    section = browser.find_element(By.CSS_SELECTOR, ".mt-run-section")
    assert "No rule has run on this trial yet" in section.text
    _shot(browser, "tb_nonfinite_values.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    browser.find_element(By.CSS_SELECTOR, "button.mt-nonfinite-link[data-tensor='loss']").click()
    _detail_at(browser, wait, "loss", NAN_AT)
    assert "NaN" in browser.find_element(By.CSS_SELECTOR, "table.mt-valuetable").text


_FIT = """
const section = document.querySelector('.mt-run-section');
const s = section.getBoundingClientRect();
const boxes = [...section.querySelectorAll('.mt-rules-box')].filter((b) => b.offsetParent !== null);
return {
  section: [section.scrollWidth, section.clientWidth],
  page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
  boxes: boxes.map((b) => ({right: b.getBoundingClientRect().right - s.right, scroll: b.scrollWidth - b.clientWidth,
                            table: b.querySelector('table').getBoundingClientRect().right - s.right})),
  open: [...section.querySelectorAll('details')].filter((d) => d.open).length,
};
"""


def test_the_expanded_rules_tables_fit_their_box(server, browser):
    wait = _open_tab(browser, server)
    _runs(browser, "findings")
    _panel(browser, wait, "rules")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.mt-rules-loud"))
    browser.find_element(By.CSS_SELECTOR, "details.mt-quiet summary").click()
    for summary in browser.find_elements(By.CSS_SELECTOR, "details.mt-history summary"):  # full-width rows
        summary.click()
    fit = browser.execute_script(_FIT)
    assert fit["open"] == 1 + 3  # the quiet rules and every rule's history
    assert len(fit["boxes"]) == 2
    for box in fit["boxes"]:  # cells wrap: nothing sticks out of the section, nothing to scroll
        assert box["right"] <= 1 and box["table"] <= 1 and box["scroll"] <= 1, fit
    assert fit["section"][0] <= fit["section"][1] + 1 and fit["page"][0] <= fit["page"][1] + 1, fit
    _shot(browser, "tb_rules_expanded.png")
