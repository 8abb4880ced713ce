"""MLflow's own UI, served by a real ``mlflow server`` (3.17.2), in headless Debian Chromium: the
links mltrace prints open its experiments and runs in the machine-learning view (runs, the
training run's description with the rule findings, rule runs named with their outcome), where
the same experiment opened without mltrace's link lands in the GenAI view (3.17's default).

Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from mltrace_mlflow import description, links
from tests.support.browser import headless_chromium
from tests.support.mlflow_env import train

pytestmark = [pytest.mark.server, pytest.mark.browser, pytest.mark.slow]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def browser():
    with headless_chromium(1500, 1100) as driver:
        yield driver


@pytest.fixture
def logged(mlflow_server, monkeypatch, tmp_path):
    """A training run (TRAIN and EVAL steps) in a new experiment of the server, and the rule
    CLI's run of VanishingGradient on its trial (it fires)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("MLTRACE_MLFLOW_PROCESS", "0")
    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLTRACE_MLFLOW_PARENT_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    hook, _ = train(tmp_path / "trial", steps=6, eval_steps=2,
                    mlflow={"experiment": "ui-view", "run_name": "lr=0.1"})
    cli = subprocess.run([sys.executable, "-m", "mltrace.rules.rule_invoker", "--trial-dir",
                          str(tmp_path / "trial"), "--rule-name", "VanishingGradient", "--threshold", "1.0"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    sink = hook.sinks[0]
    return mlflow_server.uri, sink.experiment_id, sink.run_id, cli


def _body(driver, wanted: str, timeout: float = 90) -> str:
    try:
        WebDriverWait(driver, timeout).until(lambda d: wanted in d.find_element(By.TAG_NAME, "body").text)
    except TimeoutException:
        _shot(driver, "mlflow-ui-timeout.png")
        raise AssertionError(f"{wanted!r} not on {driver.current_url} after {timeout} s; it shows:\n"
                             + driver.find_element(By.TAG_NAME, "body").text[:3000]) from None
    return driver.find_element(By.TAG_NAME, "body").text


def _shot(driver, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / name))


def test_mltrace_links_open_the_machine_learning_view(logged, browser):
    uri, experiment_id, run_id, cli = logged
    client = MlflowClient(uri)
    assert client.get_experiment(experiment_id).tags[links.EXPERIMENT_KIND_TAG] == "custom_model_development"
    rule_run = client.search_runs([experiment_id], "tags.`mltrace.run_type` = 'rule'")[0]
    rule_url = links.run_url(uri, experiment_id, rule_run.info.run_id)
    assert cli.returncode == 1, cli.stderr  # the rule fired: the CLI's exit code is unchanged
    assert f"View run ✖ VanishingGradient: IssuesFound @0 at: {rule_url}" in cli.stdout
    assert rule_url.endswith("?workflowType=machine_learning")
    urls = [w for w in cli.stdout.split() if w.startswith("http")]
    assert len(urls) == 2 and all(u.endswith("?workflowType=machine_learning") for u in urls)

    # Without mltrace's link, MLflow 3.17 opens an experiment in its GenAI view (overview, traces).
    browser.get(f"{uri}/#/experiments/{experiment_id}")
    WebDriverWait(browser, 120).until(lambda d: "workflowType=" in d.current_url)
    assert "workflowType=genai" in browser.current_url and "/runs" not in browser.current_url
    _shot(browser, "mlflow-ui-experiment-without-link.png")

    # mltrace's experiment link: the runs table with the training run.
    browser.get(links.experiment_url(uri, experiment_id))
    _body(browser, "lr=0.1")
    assert "workflowType=machine_learning" in browser.current_url and "/traces" not in browser.current_url
    # The rule run is nested under the training run: unfolded, its name says what it found.
    expander = browser.find_element(
        By.XPATH, "//a[normalize-space()='lr=0.1']/ancestor::div[contains(@class,'ag-cell')]//button")
    expander.click()
    _body(browser, "✖ VanishingGradient: IssuesFound @0")
    _shot(browser, "mlflow-ui-experiment.png")

    # The training run: its description says what the rule found, at which step.
    browser.get(links.run_url(uri, experiment_id, run_id))
    text = _body(browser, "mltrace: 1 of 1 rules found issues")  # first, above the fold
    assert "VanishingGradient" in text and "global step 0 (TRAIN step 0)" in text
    assert "TRAIN 6 (global 0..5), EVAL 2 (global 6..7 = EVAL 0..1)" in text
    assert "workflowType=machine_learning" in browser.current_url
    _shot(browser, "mlflow-ui-training-run.png")
    note = client.get_run(run_id).data.tags[description.NOTE_TAG]
    assert "#### mltrace: 1 of 1 rules found issues" in note

    # The rule run the CLI printed: named with its outcome.
    browser.get(rule_url)
    _body(browser, "✖ VanishingGradient: IssuesFound @0")
    assert "workflowType=machine_learning" in browser.current_url
    _shot(browser, "mlflow-ui-rule-run.png")
