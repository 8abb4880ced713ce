"""What a person sees of mltrace on MLflow's pages: the training run's description (trial, steps,
collections, rule findings in full), rule runs named with their outcome, summary.html with the
findings and charts with a scale, experiments tagged for the machine-learning view, links that
open there, one step axis. A real MLflow server and Chromium: test_mlflow_ui_browser.py."""

from __future__ import annotations

import numpy as np
from mlflow import MlflowClient

from mltrace.rules import Rule, invoke_rule
from mltrace.rules.builtin.exploding_tensor import ExplodingTensor
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.trials import create_trial
from mltrace_mlflow import description, links, summary
from tests.support.mlflow_env import train
from tests.support.rule_trials import write_trial

LONG = "x" * 3000


class _Chatty(Rule):
    """Fires at global step 7 (an EVAL step) with a 3000-character message."""

    def invoke_at_step(self, step: int) -> bool:
        if step == 7:
            self.last_message = f"{self.base_trial.mode_modestep(step)[0].name} finding {LONG} end"
            return True
        return False


def _artifact_text(client, run_id: str, path: str, tmp_path) -> str:
    local = client.download_artifacts(run_id, path, str(tmp_path / "dl"))
    with open(local, encoding="utf-8") as f:
        return f.read()


def test_training_run_describes_trial_and_findings_and_rule_runs_show_status(tracking, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=6, eval_steps=3, mlflow={"experiment": "pages"})
    run_id = hook.sinks[0].run_id
    client = MlflowClient()
    experiment = client.get_experiment_by_name("pages")
    assert experiment.tags[links.EXPERIMENT_KIND_TAG] == links.MACHINE_LEARNING_KIND
    note = client.get_run(run_id).data.tags[description.NOTE_TAG]
    assert "TRAIN 6 (global 0..5), EVAL 3 (global 6..8 = EVAL 0..2)" in note
    assert "gradients (4), losses (1), weights (2)" in note and "no rule has run" in note
    client.set_tag(run_id, description.NOTE_TAG, "My own notes: lr too high?\n\n" + note)

    trial = create_trial(str(tmp_path / "trial"))
    clean = invoke_rule(ExplodingTensor(trial), end_step=9)
    fired = invoke_rule(VanishingGradient(trial, threshold=1.0), end_step=9)
    chatty = invoke_rule(_Chatty(trial), end_step=9)

    note = client.get_run(run_id).data.tags[description.NOTE_TAG]
    assert note.startswith("My own notes: lr too high?")  # the user's text stays, ours is rewritten
    assert note.count(description.START) == 1 and "no rule has run" not in note
    assert "#### mltrace: 2 of 3 rules found issues" in note
    rows = [line for line in note.splitlines() if line.startswith("| [")]
    assert [r.split("]")[0][3:] for r in rows] == ["VanishingGradient", "_Chatty", "ExplodingTensor"]
    assert "global step 0 (TRAIN step 0)" in rows[0] and fired.message.replace("|", "\\|") in rows[0]
    assert "global step 7 (EVAL step 1)" in rows[1] and f"EVAL finding {LONG} end" in rows[1]
    assert links.run_page(fired.mlflow_experiment_id, fired.mlflow_run_id) in rows[0]
    assert "NoIssuesFound" in rows[2]

    names = {r.mlflow_run_id: client.get_run(r.mlflow_run_id).info.run_name for r in (clean, fired, chatty)}
    assert names == {clean.mlflow_run_id: "✔ ExplodingTensor: NoIssuesFound",
                     fired.mlflow_run_id: "✖ VanishingGradient: IssuesFound @0",
                     chatty.mlflow_run_id: "✖ _Chatty: IssuesFound @7"}
    tags = client.get_run(run_id).data.tags
    assert tags["mltrace.rule._Chatty.message"] == f"EVAL finding {LONG} end"  # not cut
    assert tags["mltrace.rule._Chatty.first_step"] == "7"  # the global step, as everywhere
    assert fired.mlflow_url is None  # a SQLite store has no UI address

    # The training run had ended: its summary.html was written again with the findings.
    page = _artifact_text(client, run_id, "mltrace/summary.html", tmp_path)
    assert page.index("Rule findings") < page.index("Collections")
    assert "2 of 3 rules found issues" in page and "global step 7 (EVAL step 1)" in page
    assert f"EVAL finding {LONG} end" in page
    assert "<tr><td>EVAL</td><td>3</td><td>6..8</td><td>0..2</td></tr>" in page  # global, own steps


def test_summary_charts_have_a_scale_that_shows_vanishing_values(tmp_path):
    steps = {s: {"gradient/tiny": np.full(4, 1e-10 * (1 + s)), "gradient/healthy": np.full(4, 0.5 + s / 10),
                 "gradient/decaying": np.full(4, 10.0 ** -s)} for s in range(6)}
    trial = create_trial(write_trial(tmp_path / "run", steps, collections={"gradients": list(steps[0])}))
    info = summary.trial_summary(trial)
    charts = {t["name"]: summary._sparkline(t["sampled_steps"], t["stats"]) for t in info["tensors"]}
    assert ">1e-10<" in charts["gradient/tiny"] and ">6e-10<" in charts["gradient/tiny"]  # its scale
    assert "log scale" not in charts["gradient/tiny"]  # 1e-10..6e-10: less than two decades
    assert ">0.5<" in charts["gradient/healthy"] and ">1<" in charts["gradient/healthy"]
    assert "log scale" in charts["gradient/decaying"] and ">1e-05<" in charts["gradient/decaying"]
    assert all("global step" in c and ">0<" in c and ">5<" in c for c in charts.values())  # x axis
    page = summary.summary_html(info)
    assert "No rule had run on this trial" in page and "Steps are global steps" in page


def test_step_text_puts_the_mode_step_beside_the_global_step(tmp_path):
    path = write_trial(tmp_path / "run", {s: {"loss": np.float32(s)} for s in range(8)},
                       modes={s: ("train" if s < 5 else "eval") for s in range(8)})
    trial = create_trial(path)
    assert description.step_text(trial, 6) == "global step 6 (EVAL step 1)"
    assert description.step_text(trial, 2) == "global step 2 (TRAIN step 2)"
    assert description.step_text(None, 2) == "global step 2"


def test_links_open_the_machine_learning_view():
    assert links.run_url("http://127.0.0.1:5000/", "3", "abc") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning")
    assert links.experiment_url("https://mlflow.example", "7") == (
        "https://mlflow.example/#/experiments/7/runs?workflowType=machine_learning")
    assert links.run_url("sqlite:////tmp/mlflow.db", "3", "abc") is None
    assert links.run_url("http://h", None, "abc") is None


def test_a_run_still_training_is_described(tracking, tmp_path):
    import time

    hook, _ = train(tmp_path / "trial", steps=4, close=False, mlflow={"flush_interval": 0.2})
    client = MlflowClient()
    run_id = hook.sinks[0].run_id
    try:
        deadline = time.monotonic() + 30
        while description.NOTE_TAG not in client.get_run(run_id).data.tags:
            assert time.monotonic() < deadline, "no description while training"
            time.sleep(0.2)
        note = client.get_run(run_id).data.tags[description.NOTE_TAG]
        assert "no rule has run on this trial yet" in note and str(tmp_path / "trial") in note
    finally:
        hook.close()
    assert "training ended" in client.get_run(run_id).data.tags[description.NOTE_TAG]
