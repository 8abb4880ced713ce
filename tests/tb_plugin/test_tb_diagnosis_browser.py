"""The diagnosis view end to end: ``mltrace tensorboard`` (a real TensorBoard process on
127.0.0.1) and headless Debian Chromium open the mltrace tab on trials of real training. The
overview shows the diagnosis (the cause, the origin tensor, the evidence, the advice, the
samples) and marks its onset step and origin tensor on the heatmap; the origin opens its detail
at the onset step. What the panel must show is what ``diagnose`` says of the same trial.

Screenshots are kept in test-artifacts/ (git-ignored): tb_diagnosis.png, tb_diagnosis_kept.png.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from mltrace.diagnosis import diagnose
from mltrace.diagnosis.stored import report_key
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from tests.diagnosis.test_diagnose import STEPS, poisoned_samples, train
from tests.support.browser import headless_chromium
from tests.support.tb_trials import GRAD, LOSS, make_torch_trial
from tests.tb_plugin.test_tb_browser import (
    _get,
    _open_tab,
    _runs,
    _shot,
    mltrace_tensorboard,
)

ONSET_RGB = [230, 81, 0]  # #e65100, the onset line's and the origin outline's colour
#: The report the "kept" trial holds (as a hook writes after a flight-recorder dump): a data
#: fault whose trouble began at TRAIN step 3 in the gradient of the first layer, loss spike at 4.
KEPT = {
    "schema": "mltrace.diagnosis/1", "trial": "kept", "worker": "worker_0", "found": True,
    "message": f"step 4: data — began at step 3 ({GRAD})",
    "steps": {"count": 8, "first": 0, "last": 7},
    "anomaly": {"step": 4, "kind": "loss_spike", "tensor": LOSS, "detail": f"{LOSS} = 9.1, 30 times its median"},
    "anomalies": [], "onset": 3,
    "origin": [{"tensor": GRAD, "layer": None, "step": 3, "phase": "backward", "z": 41.5, "value": 2.5,
                "window_median": 0.1},
               {"tensor": LOSS, "layer": None, "step": 4, "phase": "loss", "z": "inf", "value": "inf",
                "window_median": 0.3}],
    "origin_layer": None,
    "cause": {"class": "data", "summary": "the loss jumped while no module output had: the batch's targets",
              "evidence": [{"cause": "data", "supports": True, "text": "2 sample(s) of the batch stand out"},
                           {"cause": "optimizer", "supports": False, "text": "0 of 2 update ratios moved"}],
              "advice": ["skip or drop the batch", "check the labels of the samples that stand out"]},
    "samples": [{"index": 2, "loss": 14.88, "batch_median": 0.0005, "fingerprint": "a5cd8b35c791c01f"},
                {"index": 4, "loss": 4.28, "batch_median": 0.0005, "fingerprint": "8a84f008c4a770d7"}],
    "record_next": ["updates", "optimizer_state"], "method": {"window": 50}, "damaged": [],
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """A short healthy run, a run with a batch poisoned at step 70 (stability and samples
    recorded: diagnosed on request), and a short run that keeps a report."""
    root = tmp_path_factory.mktemp("diagnosis_tb")
    make_torch_trial(root / "exp" / "healthy")
    train(root / "exp" / "poisoned", poisoned_samples, collections=("stability", "samples"))
    make_torch_trial(root / "exp" / "kept")
    open_storage(str(root / "exp" / "kept")).write(report_key("worker_0"), json.dumps(KEPT).encode())
    return root


@pytest.fixture(scope="module")
def fast_server(logs):
    """``mltrace tensorboard`` on the trials (Rust loader)."""
    with mltrace_tensorboard(logs) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with headless_chromium(1400, 1900) as driver:
        yield driver


def _section(wait, found: str):
    return wait.until(lambda d: [s for s in d.find_elements(By.CSS_SELECTOR, f"#mt-diagnosis[data-found='{found}']")])[0]


def _pixel(driver, x: int, y: int) -> list[int]:
    return driver.execute_script(
        "return Array.from(document.querySelector('.mt-ov-canvas').getContext('2d')"
        ".getImageData(arguments[0], arguments[1], 1, 1).data).slice(0, 3)", x, y)


def _origin_outlined(driver, row: int) -> bool:
    """Whether the overview's row ``row`` has the origin's outline (its left edge, mid-row)."""
    canvas = driver.find_element(By.CSS_SELECTOR, ".mt-ov-canvas")
    row_h = (int(canvas.get_attribute("height")) - 12) // int(canvas.get_attribute("data-rows"))
    return _pixel(driver, 0, 12 + row * row_h + row_h // 2) == ONSET_RGB


def _onset_line(driver):
    lines = driver.find_elements(By.CSS_SELECTOR, ".mt-ov-grid .mt-diag-line.mt-onset")
    assert len(lines) == 1
    return lines[0]


def test_a_healthy_run_says_no_anomaly_with_the_thresholds_and_marks_nothing(fast_server, browser, logs):
    expected = diagnose(create_trial(str(logs / "exp" / "healthy"))).to_dict()
    wait = _open_tab(browser, fast_server)
    _runs(browser, "healthy")
    section = _section(wait, "0")
    assert section.find_element(By.ID, "mt-diag-message").text == expected["message"]
    assert "no anomaly in 8 steps" in expected["message"] and "robust z >= 8" in expected["message"]
    assert "computed now" in section.text and "not written into the trial" in section.text
    assert not browser.find_elements(By.CSS_SELECTOR, ".mt-diag-line, .mt-ov-label.mt-origin, #mt-diag-cause")
    assert browser.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-onset-column") == "-1"


def test_the_diagnosis_of_a_poisoned_batch_beside_the_overview_and_its_marks(fast_server, browser, logs):
    expected = diagnose(create_trial(str(logs / "exp" / "poisoned"))).to_dict()
    assert expected["found"] and expected["origin"], expected["message"]
    origin, onset, cause = expected["origin"][0]["tensor"], expected["onset"], expected["cause"]
    wait = _open_tab(browser, fast_server)
    _runs(browser, "poisoned")
    section = _section(wait, "1")
    assert section.find_element(By.ID, "mt-diag-message").text == expected["message"]
    assert section.find_element(By.ID, "mt-diag-cause").text == cause["class"]
    assert section.find_element(By.ID, "mt-diag-summary").text == cause["summary"]
    links = section.find_elements(By.CSS_SELECTOR, "button.mt-diag-origin")
    assert [b.get_attribute("data-tensor") for b in links] == [o["tensor"] for o in expected["origin"]]
    assert links[0].text == origin and links[0].get_attribute("data-step") == str(onset)
    evidence = section.find_elements(By.CSS_SELECTOR, "ul.mt-evidence li")
    assert sorted(e.text for e in evidence) == sorted(
        f"{'+' if e['supports'] else '−'} {e['cause']}: {e['text']}" for e in cause["evidence"])
    assert [a.text for a in section.find_elements(By.CSS_SELECTOR, "ul.mt-advice li")] == cause["advice"]
    samples = [s.text for s in section.find_elements(By.CSS_SELECTOR, "ul.mt-samples li")]
    assert len(samples) == len(expected["samples"])
    assert all(s["fingerprint"] in t for s, t in zip(expected["samples"], samples))
    # on a collection without the origin tensor, the section offers the smallest one with it
    collections = _get(f"{fast_server}/data/plugin/mltrace/run?run=poisoned")["collections"]
    target = min((len(v), k) for k, v in collections.items() if origin in v and k not in ("all", "default"))[1]
    other = min((len(v), k) for k, v in collections.items() if origin not in v)[1]
    Select(browser.find_element(By.ID, "mt-ov-collection")).select_by_value(other)
    button = wait.until(lambda d: d.find_element(By.ID, "mt-diag-show-origin"))
    assert button.get_attribute("data-collection") == target
    assert browser.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-origin-row") == "-1"
    button.click()
    wait.until(lambda d: Select(d.find_element(By.ID, "mt-ov-collection")).first_selected_option.text == target)
    _section(wait, "1")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-origin-row") != "-1")
    assert not browser.find_elements(By.ID, "mt-diag-show-origin")
    canvas = browser.find_element(By.CSS_SELECTOR, ".mt-ov-canvas")
    assert canvas.get_attribute("data-columns") == str(STEPS)  # one column per step: column = step
    rows = [r["tensor"] for r in _get(f"{fast_server}/data/plugin/mltrace/overview?" + urllib.parse.urlencode(
        {"run": "poisoned", "collection": target, "columns": STEPS}))["rows"]]
    row = int(canvas.get_attribute("data-origin-row"))
    assert rows[row] == origin and canvas.get_attribute("data-rows") == str(len(rows))
    # its name stands out beside its row (a label, or a tag where rows are too thin for names)
    marked = browser.find_elements(By.CSS_SELECTOR, ".mt-ov-grid .mt-origin")
    assert [m.get_attribute("data-tensor") for m in marked] == [origin]
    row_h = (int(canvas.get_attribute("height")) - 12) / len(rows)
    middle = marked[0].location["y"] + marked[0].size["height"] / 2 - canvas.location["y"]
    assert abs(middle - (12 + (row + 0.5) * row_h)) <= row_h / 2 + 1, (middle, row, row_h)
    assert _origin_outlined(browser, row)
    assert len(rows) == 1 or not _origin_outlined(browser, (row + 1) % len(rows))  # only its row
    line = _onset_line(browser)
    assert line.get_attribute("data-step") == str(onset) and line.get_attribute("data-column") == str(onset)
    assert canvas.get_attribute("data-onset-column") == str(onset)
    # the line stands over the onset's column of the heatmap
    cell = canvas.size["width"] / STEPS
    offset = line.location["x"] - canvas.location["x"]
    assert abs(offset - (onset + 0.5) * cell) <= 2, (offset, cell)
    assert f"onset {onset}" in line.text
    _shot(browser, "tb_diagnosis.png")
    # the origin opens its detail at the onset step
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    browser.find_element(By.CSS_SELECTOR, f"button.mt-diag-origin[data-tensor='{origin}']").click()
    plot = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#mt-chart"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-chart .uplot"))
    assert Select(browser.find_element(By.ID, "mt-tensor")).first_selected_option.get_attribute("value") == origin
    assert plot.get_attribute("data-marked-step") == str(onset)
    assert browser.find_element(By.ID, "mt-marked-step").get_attribute("data-step") == str(onset)
    assert Select(browser.find_element(By.ID, "mt-step")).first_selected_option.get_attribute("value") == str(onset)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.mt-valuetable td"))
    assert f"step {onset}:" in browser.find_element(By.CSS_SELECTOR, ".mt-values").text


def test_a_kept_report_is_shown_as_kept_with_its_samples_and_marks(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    _runs(browser, "kept")
    section = _section(wait, "1")
    assert section.get_attribute("data-source") == "stored" and "kept in the trial (worker_0)" in section.text
    assert section.find_element(By.ID, "mt-diag-cause").text == "data"
    assert [s.get_attribute("data-index") for s in section.find_elements(By.CSS_SELECTOR, "ul.mt-samples li")] == ["2", "4"]
    assert "sample 2: loss 14.88 (batch median 5.00e-4), fingerprint a5cd8b35c791c01f" in section.text
    assert "Not recorded (would tell more): updates, optimizer_state" in section.text
    signs = {li.get_attribute("data-cause"): li.find_element(By.CSS_SELECTOR, ".mt-ev-sign").text
             for li in section.find_elements(By.CSS_SELECTOR, "ul.mt-evidence li")}
    assert signs == {"data": "+", "optimizer": "−"}
    assert "not finite" in section.find_element(By.CSS_SELECTOR, "table.mt-diag-origins").text
    # the origin is a gradient: marked in the overview's default collection at once
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-origin-row") != "-1")
    assert [m.get_attribute("data-tensor") for m in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label.mt-origin")] == [GRAD]
    assert not browser.find_elements(By.ID, "mt-diag-show-origin")
    line = _onset_line(browser)
    assert line.get_attribute("data-step") == "3" and line.get_attribute("data-column") == "3"
    later = browser.find_elements(By.CSS_SELECTOR, ".mt-ov-grid .mt-anomaly-line")
    assert [x.get_attribute("data-step") for x in later] == ["4"]
    assert "onset, ▭ origin (diagnosis)" in browser.find_element(By.CSS_SELECTOR, ".mt-ov-legend").text
    _shot(browser, "tb_diagnosis_kept.png")
