"""``mltrace run``: unmodified PyTorch, Keras and XGBoost scripts get a hook (models, losses,
modes, several models, workers), behave exactly as without mltrace, and bad input is refused
clearly before the script starts. Every run is a real subprocess (mltrace run execs the script)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mltrace.trials import create_trial
from tests.support.launch_runs import ROOT, check, environment, mltrace_run, plain, run

SAVE_EVERY_STEP = ("--save-interval", "1", "--include-collections", "weights,gradients,losses")

FUNCTIONAL = """
import sys
import torch
import torch.nn.functional as F
from torch import nn

print("argv", sys.argv[1:], "name", __name__, "file", __file__.rsplit("/", 1)[-1])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
augment = nn.Dropout(0.0)  # a module with no parameters, called twice a step: not a model
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    optimizer.zero_grad()
    x = augment(augment(torch.randn(5, 4)))
    loss = F.cross_entropy(model(x), torch.randint(0, 3, (5,)))
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.6f}")
model.eval()
with torch.no_grad():
    for _ in range(2):
        model(torch.randn(5, 4))
with torch.inference_mode():
    model(torch.randn(5, 4))
if len(sys.argv) > 1 and sys.argv[1] == "fail":
    raise ValueError("the script's own error")
"""


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_functional_loss_modes_argv_and_output(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", FUNCTIONAL)
    expected = check(plain(script, "a", "--b"))
    out = tmp_path / "trial"
    got = check(mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script), "a", "--b"))
    assert got == expected  # same output, same sys.argv, __main__, __file__
    assert "argv ['a', '--b'] name __main__ file train.py" in got
    trial = create_trial(str(out))
    assert trial.steps(mode="train") == [0, 1, 2, 3]
    assert trial.steps(mode="eval") == [0, 1]
    assert trial.steps(mode="predict") == [0]
    assert set(trial.tensor_names()) == {
        "Sequential_0.weight", "Sequential_2.weight", "loss_output_0",
        *(f"gradient/Sequential_{i}.{k}" for i in (0, 2) for k in ("weight", "bias"))}
    losses = [float(line.split()[1]) for line in got.splitlines() if line.startswith("loss ")]
    saved = [float(trial.tensor("loss_output_0").value(s, mode="train")) for s in range(4)]
    np.testing.assert_allclose(saved, losses, rtol=1e-5)
    assert trial.tensor("gradient/Sequential_0.weight").steps(mode="eval") == []


def test_a_script_that_raises_keeps_its_traceback_and_exit_code(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", FUNCTIONAL)
    expected = plain(script, "fail")
    out = tmp_path / "trial"
    got = mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script), "fail")
    assert expected.returncode == got.returncode == 1
    assert got.stderr == expected.stderr  # the script's own traceback, no mltrace frame
    assert got.stderr.rstrip().endswith("ValueError: the script's own error")
    assert "mltrace" not in got.stderr
    trial = create_trial(str(out))  # what was written before the error stays readable
    assert trial.steps(mode="train") == [0, 1, 2, 3]
    assert trial.tensor("loss_output_0").value(3, mode="train").shape == ()


def test_exit_code_of_sys_exit_is_kept(tmp_path: Path) -> None:
    script = write(tmp_path, "exit.py", "import sys\nprint('bye')\nsys.exit(7)\n")
    got = mltrace_run("--out-dir", str(tmp_path / "trial"), str(script))
    assert (got.returncode, got.stdout, got.stderr) == (7, "bye\n", "")


GAN = """
import torch
from torch import nn

class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))
    def forward(self, z):
        return self.net(z)

class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1), nn.Sigmoid())
    def forward(self, x):
        return self.net(x)

torch.manual_seed(0)
G, D = Generator(), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), 1e-3)
opt_d = torch.optim.Adam(D.parameters(), 1e-3)
bce = nn.BCELoss()
for step in range(3):
    real = torch.randn(6, 3)
    fake = G(torch.randn(6, 2))
    opt_d.zero_grad()
    d_loss = bce(D(real), torch.ones(6, 1)) + bce(D(fake.detach()), torch.zeros(6, 1))
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    g_loss = bce(D(fake), torch.ones(6, 1))
    g_loss.backward()
    opt_g.step()
print("done")
"""


def test_gan_registers_both_models_and_the_loss_module(tmp_path: Path) -> None:
    script = write(tmp_path, "gan.py", GAN)
    out = tmp_path / "trial"
    check(mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script)))
    trial = create_trial(str(out))
    names = set(trial.tensor_names())
    assert trial.steps(mode="train") == [0, 1, 2]  # a step per generator forward
    for model in ("Generator", "Discriminator"):
        assert {f"{model}_net.0.weight", f"gradient/{model}_net.2.bias"} <= names
        # weights from the first step on, as when both are registered before the loop
        assert trial.tensor(f"{model}_net.0.weight").steps() == [0, 1, 2]
    # three BCELoss calls a step; the summed d_loss is not saved a second time as loss_output_0
    assert {n for n in names if "output" in n} == {f"BCELoss_output_{i}" for i in range(3)}
    # the same trial as the script with mltrace lines registering both models and the loss
    with_lines = tmp_path / "with_lines"
    lines = GAN.replace("bce = nn.BCELoss()\n", textwrap.dedent(f"""\
        bce = nn.BCELoss()
        import mltrace.pytorch as smd
        hook = smd.Hook(out_dir={str(with_lines)!r}, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["weights", "gradients", "losses"])
        hook.register_module(G)
        hook.register_module(D)
        hook.register_loss(bce)
        hook.set_mode(smd.modes.TRAIN)
        """))
    check(plain(write(tmp_path, "gan_with_lines.py", lines)))
    expected = create_trial(str(with_lines))
    assert trial.tensor_names() == expected.tensor_names()
    for name in expected.tensor_names():
        assert trial.tensor(name).steps() == expected.tensor(name).steps() == [0, 1, 2]
        for step in range(3):
            np.testing.assert_array_equal(trial.tensor(name).value(step),
                                          expected.tensor(name).value(step))


def test_two_models_of_one_class_get_distinct_names(tmp_path: Path) -> None:
    source = GAN.replace("G, D = Generator(), Discriminator()", textwrap.dedent("""\
        G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))
        D = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1), nn.Sigmoid())"""))
    script = write(tmp_path, "gan_sequential.py", source)
    out = tmp_path / "trial"
    check(mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script)))
    trial = create_trial(str(out))
    weights = trial.tensor_names(collection="weights")
    assert weights == ["Sequential2_0.weight", "Sequential2_2.weight",  # D: the second one
                       "Sequential_0.weight", "Sequential_2.weight"]
    assert trial.tensor("Sequential2_0.weight").value(0).shape == (8, 3)
    assert trial.tensor("Sequential_0.weight").value(0).shape == (8, 2)


OWN_HOOK = """
import sys
import torch
from torch import nn
import mltrace.pytorch as smd

hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1),
                include_collections=["weights"])
model = nn.Linear(3, 2)
hook.register_module(model)
for _ in range(2):
    model(torch.randn(4, 3)).sum().backward()
hook.close()
"""


def test_a_script_with_its_own_hook_keeps_it(tmp_path: Path) -> None:
    script = write(tmp_path, "own.py", OWN_HOOK)
    own, ours = tmp_path / "own", tmp_path / "ours"
    check(mltrace_run("--out-dir", str(ours), *SAVE_EVERY_STEP, str(script), str(own)))
    assert not ours.exists()  # no second hook
    trial = create_trial(str(own))
    assert trial.tensor_names() == ["Linear_weight"]
    assert trial.steps() == [0, 1]


@pytest.mark.slow
def test_graph_mode_examples_own_hook_is_kept(tmp_path: Path) -> None:
    """The original SessionHook example (it passes its own hook to its MonitoredTrainingSession
    and wraps its optimizer) under mltrace run: no second hook, its trial as without mltrace."""
    own, ours = tmp_path / "own", tmp_path / "ours"
    check(mltrace_run("--out-dir", str(ours), *SAVE_EVERY_STEP,
                      str(ROOT / "examples" / "tensorflow" / "session_hook.py"), "--out-dir", str(own)))
    assert not ours.exists()  # no second hook
    trial = create_trial(str(own))
    assert trial.steps(mode="train") == [0, 5, 10, 15] and trial.steps(mode="eval") == [0]
    assert "w:0" in trial.tensor_names()


def test_module_mode_and_config_file_from_the_environment(tmp_path: Path) -> None:
    write(tmp_path, "trainmod.py", FUNCTIONAL)
    out = tmp_path / "trial"
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({
        "LocalPath": str(out), "HookParameters": {"save_interval": "2"},
        "CollectionConfigurations": [{"CollectionName": "losses"}]}))
    env = environment(SMDEBUG_CONFIG_FILE_PATH=str(config))
    got = check(mltrace_run("-m", "trainmod", "x", cwd=tmp_path, env=env))
    assert "argv ['x'] name __main__ file trainmod.py" in got
    trial = create_trial(str(out))
    assert trial.tensor_names() == ["loss_output_0"]
    assert trial.steps(mode="train") == [0, 2]


SPAWN = """
import multiprocessing as mp
import torch
from torch import nn

def train():
    model = nn.Linear(3, 2)
    for _ in range(3):
        model(torch.randn(4, 3)).pow(2).mean().backward()

if __name__ == "__main__":
    child = mp.get_context("spawn").Process(target=train)
    child.start()
    child.join()
    print("child exit", child.exitcode)
"""


def test_a_spawned_worker_gets_its_hook(tmp_path: Path) -> None:
    script = write(tmp_path, "spawn.py", SPAWN)
    out = tmp_path / "trial"
    assert "child exit 0" in check(mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script)))
    trial = create_trial(str(out))
    assert trial.steps(mode="train") == [0, 1, 2]
    assert {"Linear_weight", "loss_output_0", "gradient/Linear_bias"} <= set(trial.tensor_names())


@pytest.mark.slow
def test_torchrun_two_workers_write_one_trial(tmp_path: Path) -> None:
    out = tmp_path / "trial"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, "--include-workers", "all",
                       torchrun, "--standalone", "--nproc-per-node", "2",
                       str(ROOT / "tests" / "launch_scripts" / "ddp_plain.py"), "--steps", "3")
    check(proc)
    for rank in (0, 1):  # each worker's own output, whichever order the two lines came in
        assert f"rank {rank} last loss" in proc.stdout, proc.stdout + proc.stderr
    trial = create_trial(str(out))
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.steps(mode="train") == [0, 1, 2]
    loss = trial.tensor("CrossEntropyLoss_output_0")
    assert loss.workers(2) == ["worker_0", "worker_1"]
    # each rank's own data, so its own loss; DDP keeps the weights the same on both ranks
    assert loss.value(2, worker="worker_0") != loss.value(2, worker="worker_1")
    weight = trial.tensor("Sequential_0.weight")
    np.testing.assert_array_equal(weight.value(2, worker="worker_0"), weight.value(2, worker="worker_1"))


KERAS = """
import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3)])
model.compile(optimizer="sgd", loss="mse")
x, y = np.random.rand(32, 4).astype("float32"), np.random.rand(32, 3).astype("float32")
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
model.evaluate(x, y, batch_size=16, verbose=0)
model.predict(x, batch_size=32, verbose=0)
print("keras done")
"""

TAPE = """
import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3)])
opt = tf.keras.optimizers.SGD(0.1)
x, y = np.random.rand(8, 4).astype("float32"), np.random.rand(8, 3).astype("float32")


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        with tf.GradientTape() as inner:  # a gradient penalty's tape: part of the outer step
            inner.watch(x)
            out = model(x, training=True)
        penalty = tf.reduce_mean(tf.square(inner.gradient(out, x)))
        loss = tf.reduce_mean(tf.square(out - y)) + 0.1 * penalty
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for _ in range(3):
    train_step(tf.constant(x), tf.constant(y))
model.compile(optimizer=opt, loss="mse")
model.fit(x, y, batch_size=4, epochs=1, verbose=0)
print("tape done")
"""

XGB_SKLEARN = """
import numpy as np
import xgboost as xgb

rng = np.random.default_rng(0)
x = rng.normal(size=(200, 3))
y = x[:, 0] * 2 + rng.normal(scale=0.1, size=200)
model = xgb.XGBRegressor(n_estimators=4, max_depth=2, n_jobs=1)
model.fit(x, y, eval_set=[(x, y)], verbose=False)
print("xgb done")
"""


@pytest.mark.slow
def test_keras_fit_evaluate_predict_get_the_hook(tmp_path: Path) -> None:
    script = write(tmp_path, "keras_train.py", KERAS)
    out = tmp_path / "trial"
    check(mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script)))
    trial = create_trial(str(out))
    assert trial.steps(mode="train") == [0, 1, 2, 3]
    assert trial.steps(mode="eval") == [0, 1]
    assert trial.steps(mode="predict") == [0]
    names = set(trial.tensor_names(collection="gradients"))
    assert len(names) == 2  # kernel and bias: the optimizer is wrapped


@pytest.mark.slow
def test_a_gradienttape_loop_gets_the_hook_one_step_per_outer_tape(tmp_path: Path) -> None:
    """A tf.function step with a tape inside the tape (a gradient penalty), then fit: each outer
    tape begins one TRAIN step, the inner one none, and fit's own tapes none (fit's 2 batches
    are 2 more steps); the optimizer is wrapped at its first apply (its gradients saved)."""
    script = write(tmp_path, "tape_train.py", TAPE)
    out = tmp_path / "trial"
    assert "tape done" in check(mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script)))
    trial = create_trial(str(out))
    assert trial.steps(mode="train") == [0, 1, 2, 3, 4]
    assert trial.tensor("loss").steps() == [0, 1, 2, 3, 4]
    gradients = trial.tensor_names(collection="gradients")
    assert len(gradients) == 2 and all(trial.tensor(g).steps() == [0, 1, 2, 3, 4] for g in gradients)
    assert trial.tensor("weights/sequential/dense/kernel:0").steps() == [0, 1, 2]  # the tape's


def test_xgboost_sklearn_estimator_gets_the_hook(tmp_path: Path) -> None:
    script = write(tmp_path, "xgb_train.py", XGB_SKLEARN)
    out = tmp_path / "trial"
    check(mltrace_run("--out-dir", str(out), "--save-interval", "1", "--include-collections",
                      "metrics,feature_importance", str(script)))
    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2, 3]
    assert "validation_0-rmse" in trial.tensor_names(collection="metrics")


@pytest.mark.parametrize(("config", "extra", "message"), [
    (None, ["--config", "{tmp}/missing.json"], "missing.json' does not exist"),
    ("not json {", [], "is not valid JSON"),
    ("[1, 2]", [], "holds a JSON list, not smdebug's object"),
    ('{"HookParameters": {"save_interval": "5"}}', [], "no trial directory: pass --out-dir"),
    ('{"LocalPath": "{tmp}/t", "CollectionConfigurations": [{"CollectionName": "wieghts"}]}', [],
     "unknown collection 'wieghts' (did you mean 'weights'?)"),
    ('{"LocalPath": "{tmp}/t", "HookParameters": {"save_interval": "often"}}', [], "often"),
])
def test_bad_configuration_is_refused_before_the_script_runs(
        tmp_path: Path, config: str | None, extra: list[str], message: str) -> None:
    script = write(tmp_path, "train.py", "print('the script ran')\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    if config is not None:
        path = tmp_path / "hook.json"
        path.write_text(config.replace("{tmp}", str(tmp_path)))
        args += ["--config", str(path)]
    got = mltrace_run(*args, str(script))
    assert got.returncode == 2
    assert got.stdout == ""
    assert got.stderr.startswith("mltrace run: error: ") and message in got.stderr, got.stderr


def test_an_out_dir_that_cannot_hold_a_trial(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    script = write(tmp_path, "train.py", "print('the script ran')\n")
    got = mltrace_run("--out-dir", str(tmp_path / "a_file" / "trial"), str(script))
    assert got.returncode == 2 and got.stdout == ""
    assert "which is a file: pass the path of a directory" in got.stderr


def test_a_hook_that_cannot_be_created_leaves_training_alone(tmp_path: Path) -> None:
    """The out_dir turns into a file after mltrace run checked it (the script makes it one):
    creating the hook fails inside the script's process, which trains on as without mltrace."""
    out = tmp_path / "trial"
    source = f"open({str(out)!r}, 'w').close()\n" + textwrap.dedent(FUNCTIONAL)
    script = write(tmp_path, "train.py", source)
    expected = check(plain(script))
    out.unlink()
    got = mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script))
    assert got.returncode == 0 and got.stdout == expected
    assert "attaching to pytorch failed" in got.stderr and "training goes on" in got.stderr
    assert out.is_file()


def test_a_script_that_does_not_exist(tmp_path: Path) -> None:
    got = mltrace_run("--out-dir", str(tmp_path / "t"), "no_such_train.py", cwd=tmp_path)
    assert got.returncode == 2
    assert "script 'no_such_train.py' does not exist" in got.stderr
    got = mltrace_run("--out-dir", str(tmp_path / "t"))
    assert got.returncode == 2 and "mltrace run needs a script" in got.stderr


def test_a_finished_trial_is_not_overwritten(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", FUNCTIONAL)
    out = tmp_path / "trial"
    check(mltrace_run("--out-dir", str(out), *SAVE_EVERY_STEP, str(script)))
    got = mltrace_run("--out-dir", str(out), str(script))
    assert got.returncode == 2 and "holds a finished run" in got.stderr
    assert create_trial(str(out)).steps(mode="train") == [0, 1, 2, 3]


def test_python_dash_m_mltrace_is_the_command() -> None:
    got = run([sys.executable, "-m", "mltrace", "run", "--help"])
    assert got.returncode == 0 and "SCRIPT [ARGS]" in got.stdout


def test_a_process_started_elsewhere_attaches_with_the_environment_set(tmp_path: Path) -> None:
    """What `mltrace run` sets for its children, set by hand: the bootstrap on PYTHONPATH and
    the configuration file, for a launcher that is not started through mltrace run."""
    from mltrace.launch import BOOTSTRAP_DIR

    script = write(tmp_path, "train.py", FUNCTIONAL)
    out = tmp_path / "trial"
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"LocalPath": str(out), "HookParameters": {"save_interval": "1"},
                                  "CollectionConfigurations": [{"CollectionName": "losses"}]}))
    env = environment(PYTHONPATH=BOOTSTRAP_DIR, MLTRACE_CONFIG_FILE_PATH=str(config))
    check(plain(script, env=env))
    assert create_trial(str(out)).steps(mode="train") == [0, 1, 2, 3]
    config.write_text(config.read_text().replace(str(out), str(tmp_path / "other")))
    check(plain(script, env=environment(MLTRACE_CONFIG_FILE_PATH=str(config))))
    assert not (tmp_path / "other").exists()  # without the bootstrap nothing attaches


def test_the_scripts_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE = 'loaded'\n")
    script = write(tmp_path, "show.py", "print(USER_SITE)\n")
    env = environment(PYTHONPATH=str(site))
    assert check(plain(script, env=env)) == "loaded\n"
    assert check(mltrace_run("--out-dir", str(tmp_path / "t"), str(script), env=env)) == "loaded\n"


def test_command_line_options_override_the_file(tmp_path: Path) -> None:
    from mltrace.launch.command import hook_parameters
    from mltrace.launch.config import merge_options, validate

    doc = {"LocalPath": "rel/trial", "HookParameters": {"save_interval": "5", "save_all": "false"},
           "CollectionConfigurations": [{"CollectionName": "weights"}]}
    args = argparse.Namespace(save_interval=1000, save_steps=None, include_regex=None,
                              reductions="mean,l2", include_workers="all", save_all=True,
                              export_tensorboard=None)
    merged = merge_options(doc, str(tmp_path / "t"), hook_parameters(args), ["weights", "losses"])
    assert merged["LocalPath"] == str(tmp_path / "t")
    assert merged["HookParameters"] == {"save_interval": "1000", "save_all": "true",
                                        "reductions": "mean,l2", "include_workers": "all"}
    assert merged["CollectionConfigurations"] == [{"CollectionName": "weights"},
                                                  {"CollectionName": "losses"}]
    assert doc["LocalPath"] == "rel/trial"  # the file's document is left as it was
    validate(merged, "test")
    assert os.path.isabs(merge_options(doc)["LocalPath"])


TURNS_NAN = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
loss_fn = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(60):
    x = torch.randn(16, 4)
    if step == 30:
        x[3, 1] = float("nan")  # a bad sample
    optimizer.zero_grad()
    loss = loss_fn(model(x), torch.zeros(16, 1))
    if torch.isfinite(loss):
        loss.backward()
        optimizer.step()
print("done")
"""


def test_the_flight_recorder_from_the_command_line_dumps_the_steps_before_a_nan(tmp_path: Path) -> None:
    from mltrace.format.flight_record import read_records
    from mltrace.storage import open_storage

    script = write(tmp_path, "train.py", TURNS_NAN)
    out = tmp_path / "trial"
    got = check(mltrace_run("--out-dir", str(out), "--save-interval", "500",
                            "--include-collections", "losses", "--flight-recorder-steps", "10",
                            "--flight-recorder-collections", "gradients,losses",
                            "--flight-recorder-reductions", "min,max", str(script)))
    assert got.strip().endswith("done")
    (record,) = read_records(open_storage(str(out)))
    (dump,) = record.dumps
    assert (dump.trigger, dump.step, dump.steps_before) == ("nonfinite", 30, list(range(20, 30)))
    assert record.first_nonfinite is not None
    assert (record.first_nonfinite.tensor, record.first_nonfinite.step) == ("MSELoss_output_0", 30)
    trial = create_trial(str(out))
    assert trial.steps() == [0, *range(20, 31), *dump.steps_after]
    assert len(dump.steps_after) == 10  # the default after_steps
    grad = next(n for n in trial.tensor_names() if n.startswith("gradient/"))
    assert np.isfinite(trial.tensor(grad).reduction_value(25, "max"))


@pytest.mark.parametrize(("options", "message"), [
    (["--flight-recorder-collections", "gradeints"], "no collection 'gradeints' (did you mean 'gradients'?)"),
    (["--flight-recorder-steps", "0"], "steps"),
    (["--flight-recorder-reductions", "min,maximum"], "maximum"),
])
def test_a_bad_flight_recorder_option_is_refused_before_the_script_runs(
        tmp_path: Path, options: list[str], message: str) -> None:
    script = write(tmp_path, "train.py", "print('the script ran')\n")
    got = mltrace_run("--out-dir", str(tmp_path / "t"), *options, str(script))
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr.startswith("mltrace run: error: ") and message in got.stderr, got.stderr


def test_flight_recorder_options_merge_into_the_files_recorder() -> None:
    from mltrace.launch.config import merge_options

    doc = {"LocalPath": "/tmp/t", "FlightRecorder": {"steps": "20", "raw": "true"}}
    assert merge_options(doc, flight_recorder={"steps": "5"})["FlightRecorder"] == {
        "steps": "5", "raw": "true"}
    assert merge_options({"LocalPath": "/tmp/t", "FlightRecorder": True},
                         flight_recorder={})["FlightRecorder"] == {}
    assert "FlightRecorder" not in merge_options({"LocalPath": "/tmp/t"})
