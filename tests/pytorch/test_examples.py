"""The examples run end to end: the Tornasole hook demo (each hook type and rule type) and the
main demo, each as a subprocess, with their trials read back through create_trial.

The runs start together in one module-scoped fixture (they are independent processes, and most
of each one's time is importing torch), then each test checks one of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mltrace.trials import create_trial

ROOT = Path(__file__).resolve().parents[2]
HOOK_DEMO = ROOT / "examples" / "pytorch" / "pytorch_hook_demos.py"
MAIN_DEMO = ROOT / "examples" / "demo.py"
TIMEOUT_S = 120

PARAMS = [f"Net_{layer}.{kind}" for layer in ("fc1", "fc2", "fc3") for kind in ("weight", "bias")]
GRADIENTS = [f"gradient/{name}" for name in PARAMS]
LOSS = "NLLLoss_output_0"

# run name -> arguments of pytorch_hook_demos.py besides --output-uri
RUNS = {
    "weights-bias-gradients": ["--hook-type", "weights-bias-gradients", "--steps", "5"],
    "module-input-output": ["--hook-type", "module-input-output", "--steps", "12"],
    "saveall": ["--hook-type", "saveall", "--steps", "5"],
    "vanishing_grad": ["--rule_type", "vanishing_grad", "--steps", "30"],
    "exploding_tensor": ["--rule_type", "exploding_tensor", "--steps", "5"],
}


class Run:
    def __init__(self, out_dir: Path, proc: subprocess.Popen) -> None:
        self.out_dir = out_dir
        self.proc = proc
        self.stdout = self.stderr = ""
        self.returncode: int | None = None

    def wait(self) -> None:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()
            self.stderr += f"\n(killed after {TIMEOUT_S}s)"
        self.returncode = self.proc.returncode

    def check(self) -> str:
        assert self.returncode == 0, (
            f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        )
        return self.stdout


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")  # several runs share the CPU
    for var in ("MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL"):
        env.pop(var, None)
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("examples")
    started = {}
    for name, extra in RUNS.items():
        out = base / name
        started[name] = Run(out, _start([str(HOOK_DEMO), "--output-uri", str(out), *extra]))
    out = base / "demo"
    started["demo"] = Run(out, _start([str(MAIN_DEMO), "--out-dir", str(out)]))
    for run in started.values():
        run.wait()
    return started


@pytest.mark.slow  # every test on `runs` waits for its ~30 s of example runs
def test_weights_bias_gradients(runs: dict[str, Run]) -> None:
    run = runs["weights-bias-gradients"]
    stdout = run.check()
    assert f"trial saved to {run.out_dir}" in stdout
    trial = create_trial(str(run.out_dir))
    assert trial.tensor_names() == sorted(PARAMS + GRADIENTS + [LOSS])
    # save_steps=[1, 2, 3]; step 0 is due too, as in smdebug (save_interval defaults to 500).
    assert {1, 2, 3} <= set(trial.steps()) <= {0, 1, 2, 3}
    assert trial.steps(mode="train") == trial.steps()
    assert trial.tensor("Net_fc1.weight").value(1).shape == (500, 20)
    assert trial.tensor("gradient/Net_fc2.weight").value(2).shape == (10, 500)
    assert sorted(trial.tensor_names(collection="gradients")) == sorted(GRADIENTS)
    assert float(trial.tensor("gradient/Net_fc3.bias").reduction_value(3, "mean", abs=True)) > 0


@pytest.mark.slow
def test_module_input_output(runs: dict[str, Run]) -> None:
    run = runs["module-input-output"]
    run.check()
    trial = create_trial(str(run.out_dir))
    names = set(trial.tensor_names())
    assert {"Net_input_0", "Net_output_0"} <= names
    assert set(PARAMS + GRADIENTS) <= names
    assert not any(n.startswith(("fc1_", "relu1_")) for n in names)  # only the top-level module
    assert sorted(trial.tensor_names(collection="l_mod")) == ["Net_input_0", "Net_output_0"]
    assert trial.steps() == [0, 10]  # save_steps=[0, 10, 20, 30, 40] within 12 steps
    assert trial.tensor("Net_input_0").value(10).shape == (32, 20)
    output = trial.tensor("Net_output_0").value(10)
    assert output.shape == (32, 4)
    np.testing.assert_allclose(np.exp(output).sum(axis=1), 1.0, rtol=1e-5)  # log_softmax


@pytest.mark.slow
def test_saveall(runs: dict[str, Run]) -> None:
    run = runs["saveall"]
    run.check()
    trial = create_trial(str(run.out_dir))
    names = set(trial.tensor_names())
    layers = ["fc1", "relu1", "fc2", "relu2", "fc3"]
    expected = {f"{m}_input_0" for m in layers} | {f"{m}_output_0" for m in layers}
    expected |= {"Net_input_0", "Net_output_0", LOSS, *PARAMS, *GRADIENTS}
    assert expected <= names
    assert set(trial.tensor_names(collection="all")) == names
    assert trial.tensor("relu1_output_0").value(2).min() >= 0
    np.testing.assert_array_equal(
        trial.tensor("fc2_output_0").value(2), trial.tensor("relu2_input_0").value(2)
    )


@pytest.mark.slow
def test_vanishing_grad_has_tiny_gradients(runs: dict[str, Run]) -> None:
    run = runs["vanishing_grad"]
    stdout = run.check()
    assert "analysis: vanishing gradient:" in stdout
    trial = create_trial(str(run.out_dir))
    assert set(trial.tensor_names()) == set(GRADIENTS + [LOSS])
    assert trial.steps() == list(range(30))  # every step saved
    smallest = min(
        float(trial.tensor(name).reduction_value(step, "mean", abs=True))
        for name in GRADIENTS
        for step in trial.tensor(name).steps()
    )
    assert smallest < 1e-7
    # ... and training started out healthy: the problem comes from the learning rate.
    assert (
        float(trial.tensor("gradient/Net_fc1.weight").reduction_value(0, "mean", abs=True)) > 1e-5
    )


@pytest.mark.slow
def test_exploding_tensor_has_nan_or_inf(runs: dict[str, Run]) -> None:
    run = runs["exploding_tensor"]
    stdout = run.check()
    assert "analysis: exploding tensor:" in stdout
    trial = create_trial(str(run.out_dir))
    assert trial.steps() == list(range(5))
    assert "fc1_output_0" in trial.tensor_names()  # saveall
    bad = [
        (name, step)
        for step in trial.steps()
        for name in trial.tensor_names(step=step)
        if trial.tensor(name).value(step).dtype.kind == "f"
        and not np.isfinite(trial.tensor(name).value(step)).all()
    ]
    assert bad
    first_step = min(step for _, step in bad)
    assert all(
        np.isfinite(trial.tensor(n).value(0)).all()
        for n in trial.tensor_names(step=0)
        if trial.tensor(n).value(0).dtype.kind == "f"
    )
    assert first_step <= 3


def test_hook_demo_reports_s3_uri_clearly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(HOOK_DEMO), "--output-uri", "s3://bucket/demo", "--steps", "1"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2
    assert "s3://bucket/demo" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_main_demo(runs: dict[str, Run]) -> None:
    run = runs["demo"]
    stdout = run.check()
    for line in (
        "Collections",
        "Tensors (",
        "Saved steps per mode:",
        "Loss curve, TRAIN",
        "Loss curve, EVAL",
        "Gradient L2 norms per TRAIN step",
        "Vanishing-gradient check",
        "no vanishing gradient",
        "create_trial(",
        "Rules (each also an MLflow run",
        "VanishingGradient    NoIssuesFound",
        "Open the results:",
        "mltrace tensorboard",
        "mlflow ui --backend-store-uri sqlite:///",
        "?workflowType=machine_learning",  # links open MLflow's machine-learning view
    ):
        assert line in stdout, f"{line!r} missing from the demo's output:\n{stdout}"
    assert not [line for line in run.stderr.splitlines() if "INFO" in line and "mltrace" in line]
    trial = create_trial(str(run.out_dir))
    assert trial.steps(mode="train") and trial.steps(mode="eval")
    assert {"weights", "biases", "gradients", "losses"} <= set(trial.collections())
    grad = trial.tensor("gradient/MLP_fc1.weight")
    step = trial.steps(mode="train")[-1]
    value = grad.value(step, mode="train")
    stored = grad.reduction_values(step, mode="train")
    np.testing.assert_allclose(
        float(stored[("l2", False)]), np.linalg.norm(value.ravel()), rtol=1e-4
    )
    np.testing.assert_allclose(float(stored[("mean", True)]), np.abs(value).mean(), rtol=1e-4)
    assert ("std", False) in stored and ("mean", False) in stored
    eval_step = trial.steps(mode="eval")[0]
    assert np.isfinite(trial.tensor("NLLLoss_output_0").value(eval_step, mode="eval"))
    # TensorBoard export beside the trial, and the MLflow store with the training and rule runs
    assert (run.out_dir / "tensorboard" / "TRAIN").is_dir()
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.out_dir.parent / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mltrace-demo").experiment_id])
    training = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    rules = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == training[0].info.run_id]
    assert len(training) == 1 and len(rules) == 4
    assert "NLLLoss_output_0" in training[0].data.metrics
