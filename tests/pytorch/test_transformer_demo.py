"""The transformer demo (examples/transformer_demo.py) runs end to end, shortened: a fault at a
fixed step, the flight recorder's dump naming the first non-finite tensor, the rules that fired
(MLflow runs nested under the training run), and the TensorBoard export.

The demo runs once, as a subprocess, in a module-scoped fixture; each test checks one part.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mltrace.trials import create_trial

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "transformer_demo.py"
TIMEOUT_S = 240
STEPS, FAULT_STEP = 40, 25
FAULT_BLOCK = "blocks.1."  # examples/transformer_demo.py's FAULT_LAYER is in block 1

pytestmark = pytest.mark.slow  # the run takes ~30-60 s on 2 cores (torch, MLflow, three rules)


class Run:
    def __init__(self, out_dir: Path, proc: subprocess.CompletedProcess) -> None:
        self.out_dir = out_dir
        self.stdout, self.stderr = proc.stdout, proc.stderr
        assert proc.returncode == 0, (
            f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    base = tmp_path_factory.mktemp("transformer-demo")
    out = base / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL",
                "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--out-dir", str(out), "--steps", str(STEPS),
         "--fault-step", str(FAULT_STEP)],
        check=False, cwd=base, env=env, text=True, capture_output=True, timeout=TIMEOUT_S)
    return Run(out, proc)


def test_the_demo_prints_the_fault_the_dump_the_rules_and_where_to_look(run: Run) -> None:
    for line in (
        f"step  {FAULT_STEP}  FAULT: blocks.1.attn.qkv.weight multiplied by 1e+20",
        f"stopped: the loss is not finite since step {FAULT_STEP}",
        f"Injected at step {FAULT_STEP}: blocks.1.attn.qkv.weight",
        f"dump at step {FAULT_STEP} (worker_0), trigger nonfinite",
        f"first non-finite tensor: {FAULT_BLOCK}attn_output_0 (step {FAULT_STEP}, forward pass",
        "ExplodingTensor    IssuesFound   fired at step",
        "VanishingGradient  NoIssuesFound",
        f"mltrace tensorboard {run.out_dir} --port 6006",
        "mlflow ui --backend-store-uri sqlite:///",
        "?workflowType=machine_learning",
    ):
        assert line in run.stdout, f"{line!r} missing from the demo's output:\n{run.stdout}"
    assert "Traceback" not in run.stderr
    assert not [line for line in run.stderr.splitlines() if "INFO" in line and "mltrace" in line]


def test_the_flight_recorder_dumped_at_the_fault_naming_the_faulted_block(run: Run) -> None:
    trial = create_trial(str(run.out_dir))
    (record,) = trial.flight_records()
    (dump,) = record.dumps
    assert dump.trigger == "nonfinite"
    assert FAULT_STEP <= dump.step <= FAULT_STEP + 1
    assert dump.steps_before == list(range(FAULT_STEP))  # every step before it (ring of 50)
    assert dump.steps_after == list(range(FAULT_STEP + 1, FAULT_STEP + 6))  # then the NaN guard
    first = trial.first_nonfinite()
    assert first is not None and first.step == FAULT_STEP and first.phase == "forward"
    assert first.tensor.startswith(FAULT_BLOCK), first
    # The dumped steps are ordinary steps of the trial, with the recorder's counts of NaNs.
    assert FAULT_STEP in trial.steps()
    assert float(trial.tensor(first.tensor).reduction_value(FAULT_STEP, "nan_count")) > 0
    assert float(trial.tensor(first.tensor).reduction_value(FAULT_STEP - 1, "nan_count")) == 0


def test_the_mlflow_store_has_the_training_run_and_its_rule_runs(run: Run) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.out_dir.parent / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mltrace-transformer-demo")
    runs = client.search_runs([experiment.experiment_id])
    (training,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    rules = {r.data.tags["mltrace.rule"]: r for r in runs
             if r.data.tags.get("mlflow.parentRunId") == training.info.run_id}
    assert set(rules) == {"NaNInfDetected", "ExplodingTensor", "VanishingGradient"}
    fired = {name for name, r in rules.items()
             if r.data.tags["mltrace.rule_status"] == "IssuesFound"}
    assert fired == {"NaNInfDetected", "ExplodingTensor"}
    assert rules["ExplodingTensor"].data.tags["mltrace.first_step"] == str(FAULT_STEP)
    tags = training.data.tags
    assert tags["mltrace.first_nonfinite.tensor"].startswith(FAULT_BLOCK)
    assert tags["mltrace.first_nonfinite.step"] == str(FAULT_STEP)
    assert "CrossEntropyLoss_output_0" in training.data.metrics


def test_the_tensorboard_export_has_event_files(run: Run) -> None:
    events = list((run.out_dir / "tensorboard" / "TRAIN").glob("events.out.tfevents.*"))
    assert events and all(e.stat().st_size > 0 for e in events)
