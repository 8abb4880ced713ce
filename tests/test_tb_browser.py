"""End to end: real ``tensorboard`` processes on 127.0.0.1 (the Rust loader through ``mltrace
tensorboard``, the Python loader through plain ``tensorboard``) and headless Debian Chromium,
driven by selenium with the Debian chromedriver, opening the mltrace tab like a person would.

The screenshot is kept in test-artifacts/ (git-ignored). Servers are started once per module
and stopped by PID (their process group: ``mltrace tensorboard`` runs TensorBoard as a child).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.rule_trials import write_trial
from tests.servers import free_port, s3_server  # noqa: F401 - fixture
from tests.tb_trials import LOSS, MLFLOW_URL, WEIGHT, make_plain_tensorboard_run, make_torch_trial

BIN = os.path.dirname(sys.executable)
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
XSS_NAME = '<img src=x onerror="document.title=1">'


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _wait_until_serving(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if _get(f"{url}/data/runs") and _get(f"{url}/data/plugin/mltrace/runs")["runs"]:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"tensorboard not serving after {timeout} s:\n{log.read_text()[-3000:]}")


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
    # A logdir for plain `tensorboard`: an ordinary run beside a link to runA's export.
    mixed = root / "mixed"
    make_plain_tensorboard_run(mixed / "plain")
    os.symlink(root / "exp" / "runA" / "tensorboard", mixed / "runA_tb")
    return root


@pytest.fixture(scope="module")
def fast_server(logs):
    """``mltrace tensorboard`` with the Rust loader (--load_fast=true)."""
    port = free_port()
    log = logs / "mltrace_tensorboard.log"
    proc = _start([f"{BIN}/mltrace", "tensorboard", str(logs / "exp"), "--host", "127.0.0.1", "--port", str(port),
                   "--load_fast=true", "--reload_interval", "1"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, proc, log)
        yield url
    finally:
        _stop(proc)


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
    assert [r["name"] for r in _get(f"{fast_server}/data/plugin/mltrace/runs")["runs"]] == ["runA", "runB", "runX"]


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
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver_bin, "install Debian's chromium and chromium-driver (scripts/setup.sh does)"
    profile = tempfile.mkdtemp(prefix="mltrace-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1400,1100", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _open_tab(driver, url: str) -> WebDriverWait:
    driver.switch_to.default_content()
    driver.get("about:blank")  # a fresh page each time: the tab keeps its choices while it lives
    driver.get(f"{url}/#mltrace")
    wait = WebDriverWait(driver, 60)
    frame = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "iframe"))[0]
    driver.switch_to.frame(frame)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#mt-tensor option")) > 1)
    return wait


def test_a_person_opens_the_tab_picks_a_tensor_and_sees_its_chart(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    assert browser.find_element(By.CSS_SELECTOR, "input.mt-run[value='runA']").is_selected()
    Select(browser.find_element(By.ID, "mt-collection")).select_by_value("weights")
    Select(browser.find_element(By.ID, "mt-tensor")).select_by_value(WEIGHT)
    paths = wait.until(lambda d: [p for p in d.find_elements(By.CSS_SELECTOR, "svg.mt-chart path.mt-series")
                                  if len(p.get_attribute("d") or "") > 20])
    assert len(paths) >= 3  # min, mean, max of TRAIN (and EVAL)
    chart = browser.find_element(By.CSS_SELECTOR, "svg.mt-chart")
    assert int(chart.get_attribute("data-points")) >= 3 * 8 and chart.size["height"] > 100
    legend = browser.find_element(By.CSS_SELECTOR, ".mt-legend").text
    assert "TRAIN · mean (6 steps)" in legend and "EVAL" in legend
    ridges = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.mt-histograms path.mt-ridge"))
    assert len(ridges) == 6  # every TRAIN step (the first mode when "all modes" is chosen)
    browser.find_element(By.ID, "mt-show-values").click()
    cells = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.mt-valuetable td"))
    assert len(cells) == 32
    browser.execute_script("window.scrollTo(0, 0)")
    browser.switch_to.default_content()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "tb_plugin_tensors.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_two_runs_overlaid_and_worker_and_downsampling_controls(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    browser.find_element(By.CSS_SELECTOR, "input.mt-run[value='runB']").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#mt-tensor option[value='{LOSS}']"))
    Select(browser.find_element(By.ID, "mt-tensor")).select_by_value(LOSS)
    wait.until(lambda d: "runB" in d.find_element(By.CSS_SELECTOR, ".mt-legend").text)
    legend = browser.find_element(By.CSS_SELECTOR, ".mt-legend").text
    assert "runA · TRAIN · value (6 steps)" in legend and "runB · TRAIN · value (4 steps)" in legend
    points = browser.find_element(By.ID, "mt-maxpoints")
    points.send_keys("3\n")
    wait.until(lambda d: "downsampled from 6 on request" in d.find_element(By.CSS_SELECTOR, ".mt-legend").text)


def test_collections_and_rules_panels_escape_names(fast_server, browser):
    wait = _open_tab(browser, fast_server)
    browser.find_element(By.CSS_SELECTOR, "button[data-panel='collections']").click()
    rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.mt-collections tr"))
    assert any(r.text.startswith("gradients") for r in rows)
    browser.find_element(By.CSS_SELECTOR, "button[data-panel='rules']").click()
    table = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "table.mt-rules"))
    assert "loss <b>did not</b> decrease" in table.text and not table.find_elements(By.TAG_NAME, "b")
    assert "IssuesFound" in table.text and "3, 4" in table.text
    link = table.find_element(By.CSS_SELECTOR, "a")
    assert link.get_attribute("href") == f"{MLFLOW_URL}/#/experiments/7/runs/abc123"
    # a tensor whose name is HTML shows as text and runs nothing
    browser.find_element(By.CSS_SELECTOR, "input.mt-run[value='runA']").click()
    browser.find_element(By.CSS_SELECTOR, "input.mt-run[value='runX']").click()
    browser.find_element(By.CSS_SELECTOR, "button[data-panel='tensors']").click()
    wait.until(lambda d: any(o.get_attribute("value") == XSS_NAME for o in d.find_elements(By.CSS_SELECTOR, "#mt-tensor option")))
    Select(browser.find_element(By.ID, "mt-tensor")).select_by_value(XSS_NAME)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.mt-chart path.mt-series"))
    assert not browser.find_elements(By.CSS_SELECTOR, "img") and browser.execute_script("return document.title") != "1"


def test_mltrace_tensorboard_on_s3(s3_server, tmp_path):  # noqa: F811 - fixture
    """A hook writes a trial and its export to S3 (SeaweedFS); ``mltrace tensorboard s3://...``
    serves both: TensorBoard's S3 loader reads the export, the tab reads the trial."""
    from torch import nn

    import mltrace.pytorch as smd
    from tests.torch_training import make_model, train

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
