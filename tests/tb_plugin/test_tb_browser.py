"""End to end: real ``tensorboard`` processes on 127.0.0.1 (the Rust loader through ``mltrace
tensorboard``, the Python loader through plain ``tensorboard``) and headless Debian Chromium,
driven by selenium with the Debian chromedriver, opening the mltrace tab like a person would.

The screenshot is kept in test-artifacts/ (git-ignored). Servers are started once per module
and stopped by PID (their process group: ``mltrace tensorboard`` runs TensorBoard as a child).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.support.browser import headless_chromium
from tests.support.flight_records import POISONED, write_records
from tests.support.rule_trials import write_trial
from tests.support.servers import free_port
from tests.support.tb_trials import (
    GRAD,
    LOSS,
    MLFLOW_URL,
    WEIGHT,
    end_live,
    make_plain_tensorboard_run,
    make_torch_trial,
    make_worker_trial,
    start_live,
    write_live_steps,
)

BIN = os.path.dirname(sys.executable)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
XSS_NAME = '<img src=x onerror="document.title=1">'


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _wait_until_serving(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120,
                        runs: int | None = None) -> None:
    """Until TensorBoard serves the tab with trials in it (with ``runs``: until the tab lists
    that many, for trials without a TensorBoard export, which TensorBoard's own /data/runs
    never lists)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            listed = _get(f"{url}/data/plugin/mltrace/runs")["runs"]
            if len(listed) == runs if runs is not None else (_get(f"{url}/data/runs") and listed):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"tensorboard not serving after {timeout} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def mltrace_tensorboard(logs: Path, runs: int | None = None) -> Iterator[str]:
    """``mltrace tensorboard`` on ``logs``/exp (Rust loader, reloading every second) from its
    first useful answer (see _wait_until_serving) to its stop; yields its URL."""
    port = free_port()
    log = logs / "mltrace_tensorboard.log"
    proc = _start([f"{BIN}/mltrace", "tensorboard", str(logs / "exp"), "--host", "127.0.0.1", "--port", str(port),
                   "--load_fast=true", "--reload_interval", "1"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, proc, log, runs=runs)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tblogs")
    make_torch_trial(root / "exp" / "runA")
    make_torch_trial(root / "exp" / "runB", train_steps=4, eval_steps=1)
    write_trial(root / "exp" / "runX", {0: {XSS_NAME: np.arange(3.0)}, 1: {XSS_NAME: np.arange(3.0) + 1}})
    make_worker_trial(root / "exp" / "runW")
    start_live(root, root / "exp" / "runLive")  # a trial still training: more steps come in the live test
    write_live_steps(root, range(3), ["gradient/a"])
    # A logdir for plain `tensorboard`: an ordinary run beside a link to runA's export.
    mixed = root / "mixed"
    make_plain_tensorboard_run(mixed / "plain")
    os.symlink(root / "exp" / "runA" / "tensorboard", mixed / "runA_tb")
    return root


@pytest.fixture(scope="module")
def fast_server(logs):
    """``mltrace tensorboard`` with the Rust loader (--load_fast=true)."""
    with mltrace_tensorboard(logs) as url:
        yield url


@pytest.fixture(scope="module")
def python_server(logs):
    """Plain ``tensorboard`` with the Python loader on a logdir that also holds an ordinary run."""
    port = free_port()
    log = logs / "tensorboard.log"
    proc = _start([f"{BIN}/tensorboard", "--logdir", str(logs / "mixed"), "--host", "127.0.0.1", "--port", str(port),
                   "--load_fast=false", "--reload_interval", "1"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, proc, log)
        yield url
    finally:
        _stop(proc)


def _eventually(read, expected, timeout: float = 60):
    """``read()`` once it equals ``expected`` (a loader may list a run before reading its data)."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def _scalars(url: str, run: str, tag: str) -> list:
    q = urllib.parse.urlencode({"run": run, "tag": tag})
    return _get(f"{url}/data/plugin/scalars/scalars?{q}")


def _histograms(url: str, run: str, tag: str) -> list:
    q = urllib.parse.urlencode({"run": run, "tag": tag})
    return _get(f"{url}/data/plugin/histograms/histograms?{q}")


def test_rust_loader_reads_the_export_and_the_plugin_reads_the_trials(fast_server):
    expected = ["runA/EVAL", "runA/TRAIN", "runB/EVAL", "runB/TRAIN"]  # never a step folder
    assert _eventually(lambda: sorted(_get(f"{fast_server}/data/runs")), expected) == expected
    steps = _eventually(lambda: [p[1] for p in _scalars(fast_server, "runA/TRAIN", LOSS)], [0, 1, 2, 3, 4, 5])
    assert steps == [0, 1, 2, 3, 4, 5]
    assert [p[1] for p in _scalars(fast_server, "runA/EVAL", LOSS)] == [6, 7]
    assert [h[1] for h in _histograms(fast_server, "runA/TRAIN", "weights/Sequential_0.weight")] == [0, 1, 2, 3, 4, 5]
    listing = _get(f"{fast_server}/data/plugins_listing")["mltrace"]
    assert listing["enabled"] and listing["tab_name"] == "mltrace"
    assert [r["name"] for r in _get(f"{fast_server}/data/plugin/mltrace/runs")["runs"]] == [
        "runA", "runB", "runLive", "runW", "runX"]


def test_python_loader_reads_the_export_beside_an_ordinary_run(python_server):
    expected = ["plain", "runA_tb/EVAL", "runA_tb/TRAIN"]
    assert _eventually(lambda: sorted(_get(f"{python_server}/data/runs")), expected) == expected
    steps = _eventually(lambda: [p[1] for p in _scalars(python_server, "runA_tb/TRAIN", LOSS)], [0, 1, 2, 3, 4, 5])
    assert steps == [0, 1, 2, 3, 4, 5]
    assert [p[1] for p in _scalars(python_server, "plain", "plain/loss")] == [0, 1, 2]
    assert len(_histograms(python_server, "runA_tb/TRAIN", "weights/Sequential_0.weight")) == 6
    # the plugin found the trial one level above the linked tensorboard/ folder
    assert [r["name"] for r in _get(f"{python_server}/data/plugin/mltrace/runs")["runs"]] == ["runA_tb"]
    series = _get(f"{python_server}/data/plugin/mltrace/series?run=runA_tb&tensor={LOSS}&mode=TRAIN")
    assert series["runs"][0]["modes"]["TRAIN"]["steps"] == [0, 1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def browser():
    with headless_chromium(1400, 1100) as driver:
        yield driver


def _open_tab(driver, url: str, ready: str = ".mt-ov-canvas") -> WebDriverWait:
    driver.switch_to.default_content()
    driver.get("about:blank")  # a fresh page each time: the tab keeps its choices while it lives
    driver.get(f"{url}/#mltrace")
    # a live trial's refresh may replace an element between finding it and reading it: the
    # wait's conditions find it again on the next poll
    wait = WebDriverWait(driver, 60, ignored_exceptions=(StaleElementReferenceException,))
    frame = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "iframe"))[0]
    driver.switch_to.frame(frame)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ready))
    return wait


def _shot(driver, name: str) -> None:
    driver.execute_script("window.scrollTo(0, 0)")
    driver.switch_to.default_content()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / name
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def _runs(driver, *wanted: str) -> None:
    """Tick exactly the runs ``wanted`` in the run list."""
    boxes = driver.find_elements(By.CSS_SELECTOR, "input.mt-run")
    # tick the new ones first, so that the tab never goes through "no run selected"
    for box in sorted(boxes, key=lambda b: b.get_attribute("value") not in wanted):
        if box.is_selected() != (box.get_attribute("value") in wanted):
            box.click()
    time.sleep(1.0)  # each click redraws the panel once the runs' /run answers are in


def _panel(driver, wait, name: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f"button[data-panel='{name}']").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f".mt-panel[data-panel='{name}']"))


def _choose(driver, wait, tensor: str) -> None:
    """Choose a tensor in the detail view through its filter box and list."""
    box = wait.until(lambda d: d.find_element(By.ID, "mt-filter"))
    box.clear()
    box.send_keys(tensor)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#mt-tensor option[value='{tensor}']"))
    Select(driver.find_element(By.ID, "mt-tensor")).select_by_value(tensor)


def _legend_values(driver) -> list[str]:
    return [v.text for v in driver.find_elements(By.CSS_SELECTOR, "#mt-chart .u-legend .u-value")]


def test_overview_opens_first_shows_gradients_and_a_row_opens_its_detail(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    assert browser.find_element(By.CSS_SELECTOR, "input.mt-run[value='runA']").is_selected()
    canvas = browser.find_element(By.CSS_SELECTOR, ".mt-ov-canvas")
    assert canvas.get_attribute("data-rows") == "4" and canvas.get_attribute("data-columns") == "6"
    kinds = json.loads(canvas.get_attribute("data-kinds"))
    assert kinds["value"] == 24 and kinds["nan"] == kinds["inf"] == 0  # 4 gradients x 6 TRAIN steps
    assert Select(browser.find_element(By.ID, "mt-ov-collection")).first_selected_option.text == "gradients"
    assert Select(browser.find_element(By.ID, "mt-ov-statistic")).first_selected_option.text == "l2"
    labels = [e.get_attribute("data-tensor") for e in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label")]
    assert labels == sorted(labels) and GRAD in labels
    assert "4 of 4 tensors in gradients, 6 global steps" in browser.find_element(By.ID, "mt-ov-info").text
    # the filter box narrows the rows at once; the statistic is chosen
    browser.find_element(By.ID, "mt-ov-filter").send_keys("weight$")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-rows") == "2")
    Select(browser.find_element(By.ID, "mt-ov-collection")).select_by_value("")  # every tensor
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-rows") == "4")
    assert WEIGHT in [e.get_attribute("data-tensor") for e in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label")]
    Select(browser.find_element(By.ID, "mt-ov-collection")).select_by_value("gradients")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-rows") == "2")
    Select(browser.find_element(By.ID, "mt-ov-statistic")).select_by_value("abs_max")
    wait.until(lambda d: "abs_max" in d.find_element(By.CSS_SELECTOR, ".mt-ov-legend").text)
    assert browser.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-rows") == "2"
    ActionChains(browser).move_to_element_with_offset(browser.find_element(By.CSS_SELECTOR, ".mt-ov-canvas"), 5, 0).perform()
    wait.until(lambda d: "abs_max" in d.find_element(By.ID, "mt-ov-tip").text)
    _shot(browser, "tb_overview.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    browser.find_element(By.CSS_SELECTOR, f".mt-ov-label[data-tensor='{GRAD}']").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-chart .uplot"))
    assert Select(browser.find_element(By.ID, "mt-tensor")).first_selected_option.get_attribute("value") == GRAD
    assert f"{GRAD} — l2 over global steps" in browser.find_element(By.CSS_SELECTOR, ".mt-chart-title").text


def test_detail_overlays_runs_with_hover_zoom_and_a_log_scale(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    _runs(browser, "runA", "runB")
    _panel(browser, wait, "tensor")
    _choose(browser, wait, LOSS)
    plot = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#mt-chart"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-chart .uplot"))
    lines = browser.find_element(By.ID, "mt-lines").text
    assert "runA · TRAIN · value (6 steps)" in lines and "runB · TRAIN · value (4 steps)" in lines
    assert "runA · EVAL · value (2 steps)" in lines
    assert plot.get_attribute("data-lines") == "4" and int(plot.get_attribute("data-points")) == 6 + 2 + 4 + 1
    over = browser.find_element(By.CSS_SELECTOR, "#mt-chart .u-over")
    ActionChains(browser).move_to_element(over).perform()  # hover: the legend shows values
    wait.until(lambda d: any(v not in ("", "—", "--") for v in _legend_values(d)[1:]))
    assert "(TRAIN" in _legend_values(browser)[0] or "(EVAL" in _legend_values(browser)[0]
    # drag to zoom on x, double-click to zoom out
    width = over.size["width"]
    ActionChains(browser).move_to_element_with_offset(over, -width // 3, 0).click_and_hold() \
        .move_by_offset(width // 4, 0).release().perform()
    zoomed = browser.execute_script("return document.querySelector('#mt-chart').dataset.xrange")
    assert zoomed and json.loads(zoomed)[1] - json.loads(zoomed)[0] < 7
    ActionChains(browser).double_click(over).perform()
    wait.until(lambda d: json.loads(d.execute_script("return document.querySelector('#mt-chart').dataset.xrange")) == [0, 7])
    browser.find_element(By.ID, "mt-logy").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-chart .uplot"))
    assert browser.find_element(By.ID, "mt-chart").get_attribute("data-log") == "1"
    # downsampling only on request, and said so
    browser.find_element(By.ID, "mt-maxpoints").send_keys("3\n")
    wait.until(lambda d: "downsampled from 6 on request" in d.find_element(By.ID, "mt-lines").text)
    assert browser.find_element(By.ID, "mt-no-histogram").text.startswith("A scalar")  # no histogram of a loss
    _shot(browser, "tb_detail.png")


def test_histograms_side_by_side_for_runs_and_workers_and_a_scrolling_value_table(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    _runs(browser, "runA", "runB")
    _panel(browser, wait, "tensor")
    _choose(browser, wait, WEIGHT)
    cells = wait.until(lambda d: [c for c in d.find_elements(By.CSS_SELECTOR, ".mt-histo-cell") if c.find_elements(By.TAG_NAME, "svg")])
    assert [c.get_attribute("data-run") for c in cells] == ["runA", "runB"]
    assert len(cells[0].find_elements(By.CSS_SELECTOR, "path.mt-ridge")) == 8  # every saved step, TRAIN and EVAL
    assert len(cells[1].find_elements(By.CSS_SELECTOR, "path.mt-ridge")) == 5
    assert "all 8 steps with saved values" in cells[0].text and "7 (EVAL 1)" in cells[0].text
    browser.find_element(By.ID, "mt-show-values").click()
    cells = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.mt-valuetable td"))
    assert len(cells) == 32
    # a number never wraps inside its exponent ("1.35e-" / "16"): every cell is one line
    assert cells[0].value_of_css_property("white-space") == "nowrap"
    assert browser.execute_script(
        "return [...arguments[0]].filter((td) => td.offsetHeight > 2 * parseFloat(getComputedStyle(td).fontSize)).length",
        cells) == 0
    scroller = browser.find_element(By.CSS_SELECTOR, ".mt-tablescroll")
    assert scroller.value_of_css_property("overflow-x") == "auto"
    steps = [o.text for o in Select(browser.find_element(By.ID, "mt-step")).options]
    assert steps[:2] == ["0 (TRAIN 0)", "1 (TRAIN 1)"] and steps[-1] == "7 (EVAL 1)"
    # two workers of one run, side by side
    _runs(browser, "runW")
    _choose(browser, wait, "w")
    browser.find_element(By.ID, "mt-perworker").click()
    cells = wait.until(lambda d: [c for c in d.find_elements(By.CSS_SELECTOR, ".mt-histo-cell") if c.find_elements(By.TAG_NAME, "svg")]
                       if len(d.find_elements(By.CSS_SELECTOR, ".mt-histo-cell")) == 2 else None)
    assert [c.find_element(By.TAG_NAME, "h4").text for c in cells] == ["runW · worker_0", "runW · worker_1"]
    lines = browser.find_element(By.ID, "mt-lines").text
    assert "worker_0 · l2 (4 steps)" in lines and "worker_1 · l2 (4 steps)" in lines and "GLOBAL" not in lines
    _shot(browser, "tb_histograms.png")
    # the overview of a run with two workers chooses whose values
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    browser.find_element(By.ID, "mt-filter").clear()
    _panel(browser, wait, "overview")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-ov-worker option[value='worker_1']"))
    Select(browser.find_element(By.ID, "mt-ov-worker")).select_by_value("worker_1")
    wait.until(lambda d: Select(d.find_element(By.ID, "mt-ov-worker")).first_selected_option.text == "worker_1")
    assert json.loads(browser.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-kinds"))["value"] == 4


def test_rules_findings_first_clean_folded_names_escaped_and_no_leak_between_panels(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    browser.find_element(By.CSS_SELECTOR, "button[data-panel='collections']").click()
    rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.mt-collections tr"))
    assert any(r.text.startswith("gradients") for r in rows)
    _panel(browser, wait, "rules")
    loud = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "table.mt-rules-loud"))
    assert "loss <b>did not</b> decrease" in loud.text and not loud.find_elements(By.TAG_NAME, "b")
    assert "IssuesFound" in loud.text and "3 (TRAIN 3), 4 (TRAIN 4)" in loud.text
    link = loud.find_element(By.CSS_SELECTOR, "a.mt-mlflow")
    assert link.get_attribute("href") == f"{MLFLOW_URL}/#/experiments/7/runs/abc123?workflowType=machine_learning"
    quiet = browser.find_element(By.CSS_SELECTOR, "details.mt-quiet")
    assert quiet.get_attribute("open") is None and "1 rule without findings" in quiet.text
    assert "VanishingGradient" not in loud.text
    loud.find_element(By.CSS_SELECTOR, "details.mt-history summary").click()
    assert "2023-11-14 22:13:20 UTC" in loud.text
    _shot(browser, "tb_rules.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    # switching panels while one loads never leaves its sections in the next one
    for _ in range(3):
        browser.find_element(By.CSS_SELECTOR, "button[data-panel='rules']").click()
        browser.find_element(By.CSS_SELECTOR, "button[data-panel='collections']").click()
        browser.find_element(By.CSS_SELECTOR, "button[data-panel='overview']").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".mt-ov-canvas"))
    time.sleep(1.5)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".mt-panel")) == 1
    assert not browser.find_elements(By.CSS_SELECTOR, ".mt-run-section")
    # a tensor whose name is HTML shows as text and runs nothing
    _runs(browser, "runX")
    _panel(browser, wait, "tensor")
    _choose(browser, wait, XSS_NAME)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-chart .uplot"))
    assert not browser.find_elements(By.CSS_SELECTOR, "img") and browser.execute_script("return document.title") != "1"


def test_rules_panel_shows_the_first_nonfinite_tensor_and_the_dumps(fast_server, browser, logs):
    write_records(str(logs / "exp" / "runB"))  # read at each request: no reload needed
    wait = _open_tab(browser, fast_server)
    _runs(browser, "runB")
    _panel(browser, wait, "rules")
    box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-nonfinite"))
    assert box.find_element(By.CSS_SELECTOR, ".mt-nonfinite-name").text == POISONED
    assert "at global step 12 (TRAIN 12), worker worker_1, forward pass" in box.text
    assert "also non-finite at that step: Net_fc3_output_0" in box.text
    rows = browser.find_elements(By.CSS_SELECTOR, "table.mt-dumps tr[data-trigger]")
    assert [r.get_attribute("data-trigger") for r in rows] == ["manual", "nonfinite", "nonfinite"]
    assert "2–11 (10 steps)" in rows[1].text and "13–15 (3 steps)" in rows[1].text
    assert f"NaN in {POISONED}" in rows[1].text and "0, 1, 2, 3, 4, 5, 6, 7 … (400 in all)" in rows[2].text
    section = browser.find_element(By.CSS_SELECTOR, ".mt-run-section")
    text = section.text  # the recorder first, then the rules' findings
    assert "Flight recorder: 3 dumps" in text and text.index(POISONED) < text.index("LossNotDecreasing")
    _shot(browser, "tb_flight_recorder.png")


def test_live_trial_new_tensors_and_steps_appear(fast_server, browser, logs):
    wait = _open_tab(browser, fast_server)
    _runs(browser, "runLive")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-rows") == "1")
    assert "live" in browser.find_element(By.ID, "mt-live").text
    assert "3 global steps" in browser.find_element(By.ID, "mt-ov-info").text
    write_live_steps(logs, range(3, 7), ["gradient/a", "gradient/b"])
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mt-ov-canvas").get_attribute("data-rows") == "2")
    wait.until(lambda d: "7 global steps" in d.find_element(By.ID, "mt-ov-info").text)
    assert "live" in browser.find_element(By.ID, "mt-live").text
    _shot(browser, "tb_live.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    end_live(logs)
    wait.until(lambda d: d.find_element(By.ID, "mt-live").text.startswith("ended"))


def test_tensorboards_reload_button_reaches_the_tab(fast_server, browser, logs):
    """A trial that appears later shows after TensorBoard's reload (its DataReloaded message to
    the plugin's frame), with no reload of the page: the tab polls only live trials' /run."""
    wait = _open_tab(browser, fast_server)
    assert not browser.find_elements(By.CSS_SELECTOR, "input.mt-run[value='runNew']")
    write_trial(logs / "exp" / "runNew", {0: {"n": np.arange(3.0)}})
    browser.switch_to.default_content()
    button = wait.until(lambda d: [b for b in d.find_elements(By.CSS_SELECTOR, "button.reload-button") if b.is_enabled()])
    button[0].click()
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "input.mt-run[value='runNew']"))


def test_mltrace_tensorboard_on_s3(s3_server, tmp_path):
    """A hook writes a trial and its export to S3 (SeaweedFS); ``mltrace tensorboard s3://...``
    serves both: TensorBoard's S3 loader reads the export, the tab reads the trial."""
    from torch import nn

    import mltrace.pytorch as smd
    from tests.support.torch_training import make_model, train

    s3_server.client().create_bucket(Bucket="tbtest")
    aws = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": s3_server.access_key,
           "AWS_SECRET_ACCESS_KEY": s3_server.secret_key, "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in aws}
    os.environ.update(aws)
    try:
        hook = smd.Hook(out_dir="s3://tbtest/exp/runS3", export_tensorboard=True,
                        save_config=smd.SaveConfig(save_interval=1), include_collections=["weights", "losses"])
        model, loss_fn = make_model(), nn.MSELoss()
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.set_mode(smd.modes.TRAIN)
        train(model, hook, 4, loss_fn=loss_fn)
        hook.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    port = free_port()
    log = tmp_path / "s3_tensorboard.log"
    out = open(log, "wb")
    proc = subprocess.Popen([f"{BIN}/mltrace", "tensorboard", "s3://tbtest/exp", "--host", "127.0.0.1",
                             "--port", str(port), "--reload_interval", "1"],
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **aws})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, proc, log)
        assert _eventually(lambda: sorted(_get(f"{url}/data/runs")), ["TRAIN"]) == ["TRAIN"]
        steps = _eventually(lambda: [p[1] for p in _scalars(url, "TRAIN", LOSS)], [0, 1, 2, 3])
        assert steps == [0, 1, 2, 3]
        assert [r["name"] for r in _get(f"{url}/data/plugin/mltrace/runs")["runs"]] == ["runS3"]
        series = _get(f"{url}/data/plugin/mltrace/series?run=runS3&tensor={WEIGHT}&mode=TRAIN")
        assert series["runs"][0]["modes"]["TRAIN"]["steps"] == [0, 1, 2, 3]
    finally:
        _stop(proc)
