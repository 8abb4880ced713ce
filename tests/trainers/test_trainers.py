"""Trainer callbacks: mltrace.transformers.MltraceCallback on a real transformers.Trainer (a tiny
BERT built from a config, no model hub) and mltrace.lightning.MltraceCallback on a real
lightning.Trainer, each with gradient accumulation 2, an SGD optimizer and a constant learning
rate, so that every TRAIN step can be checked against the optimizer's own update:
weight(step k+1) - weight(step k) == -lr * gradient(step k) holds only if a step is one optimizer
step and the saved gradient is the accumulated one the optimizer used.
"""

from __future__ import annotations

import json
import os
import pickle

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the model hub

import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import mltrace  # noqa: E402
from mltrace.exceptions import MltraceValueError  # noqa: E402
from mltrace.format import paths  # noqa: E402
from mltrace.lightning import MltraceCallback as LightningCallback  # noqa: E402
from mltrace.modes import ModeKeys  # noqa: E402
from mltrace.rules import invoke_rule  # noqa: E402
from mltrace.rules.builtin import LossNotDecreasing, VanishingGradient  # noqa: E402
from mltrace.transformers import MltraceCallback  # noqa: E402
from mltrace.trials import create_trial  # noqa: E402
from tests.support.pickled_models import hook_entries  # noqa: E402

TRAIN, EVAL, PREDICT = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT
COLLECTIONS = ["weights", "biases", "gradients", "losses", "metrics"]
LR = 0.1


# -- Transformers -----------------------------------------------------------------------------------
class Tokens(torch.utils.data.Dataset):
    """Random token sequences; the label says whether the first token is in the upper half."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 40, (n, 8), generator=gen)
        self.labels = (self.ids[:, 0] >= 20).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=2)
    return BertForSequenceClassification(config)


def hf_trainer(tmp_path, callback, report_to="none", max_steps=4) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
        gradient_accumulation_steps=2, max_steps=max_steps, logging_steps=1, eval_strategy="steps",
        eval_steps=2, optim="sgd", learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=0.0, report_to=report_to, use_cpu=True, save_strategy="no",
        disable_tqdm=True, seed=0, dataloader_num_workers=0)
    return Trainer(model=tiny_bert(), args=args, train_dataset=Tokens(64, 1),
                   eval_dataset=Tokens(8, 2), callbacks=[callback])


def check_optimizer_steps(trial, root: str, steps: list[int]) -> None:
    """Each TRAIN step is one optimizer step whose saved gradient the SGD update used."""
    checked = 0
    for name in trial.tensor_names(collection="weights"):
        grad = trial.tensor(f"gradient/{name}")
        weight = trial.tensor(name)
        for before, after in zip(steps, steps[1:]):
            update = weight.value(after, mode=TRAIN) - weight.value(before, mode=TRAIN)
            np.testing.assert_allclose(update, -LR * grad.value(before, mode=TRAIN), rtol=1e-4, atol=1e-6)
            checked += 1
    assert checked >= len(steps) - 1 and any(n.startswith(root) for n in trial.tensor_names(collection="weights"))


def test_transformers_trainer_saves_each_optimizer_step_in_its_mode(tmp_path):
    callback = MltraceCallback(out_dir=str(tmp_path / "trial"), save_config=mltrace.SaveConfig(save_interval=1),
                               include_collections=COLLECTIONS)
    trainer = hf_trainer(tmp_path, callback)
    trainer.train()

    # At the end of train() the trial is readable up to its last step, before close.
    trial = create_trial(str(tmp_path / "trial"))
    assert trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    assert not os.path.exists(tmp_path / "trial" / paths.END_OF_JOB_MARKER)
    trainer.predict(Tokens(8, 3))
    with torch.no_grad():  # the script's own inference, outside evaluate/predict: not recorded
        trainer.model.eval()(input_ids=Tokens(2, 4).ids)
    # the model pickles without the callback's hooks (issue 34)
    saved = pickle.dumps(trainer.model)
    assert b"mltrace" not in saved and hook_entries(pickle.loads(saved)) == 0
    callback.close()

    trial = create_trial(str(tmp_path / "trial"))
    assert trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    assert trial.steps(mode=EVAL) == [0, 1]  # evaluations after optimizer steps 2 and 4, one batch each
    assert trial.steps(mode=PREDICT) == [0]
    check_optimizer_steps(trial, "BertForSequenceClassification_", trial.steps(mode=TRAIN))

    # Two micro-batches per TRAIN step, each with the model's own loss; one per EVAL batch.
    losses = set(trial.tensor_names(collection="losses"))
    assert losses == {"loss_output_0", "loss_output_1"}
    for step in trial.steps(mode=TRAIN):
        for name in losses:
            assert 0.3 < float(trial.tensor(name).value(step, mode=TRAIN)) < 1.5
    assert trial.tensor("loss_output_1").steps(mode=EVAL) == []

    # The Trainer's logs, at the step they were logged in; eval_loss is the EVAL batch's loss.
    metrics = set(trial.tensor_names(collection="metrics"))
    assert {"loss", "grad_norm", "learning_rate", "eval_loss", "test_loss", "train_runtime"} <= metrics
    assert trial.tensor("learning_rate").steps(mode=TRAIN) == [0, 1, 2, 3]
    assert float(trial.tensor("learning_rate").value(2, mode=TRAIN)) == pytest.approx(LR)
    for step in trial.steps(mode=EVAL):
        logged = float(trial.tensor("eval_loss").value(step, mode=EVAL))
        assert logged == pytest.approx(float(trial.tensor("loss_output_0").value(step, mode=EVAL)), rel=1e-6)
    test_loss = float(trial.tensor("test_loss").value(0, mode=PREDICT))
    assert test_loss == pytest.approx(float(trial.tensor("loss_output_0").value(0, mode=PREDICT)), rel=1e-6)

    # A rule runs on the trial, at every step with gradients (TRAIN), and finds what is there:
    # attention key biases get no gradient (softmax ignores a constant added to every key).
    result = invoke_rule(VanishingGradient(trial), end_step=max(trial.steps()) + 1)
    gradient_steps = trial.tensor("gradient/BertForSequenceClassification_classifier.weight").steps()
    assert result.fired_steps == gradient_steps and len(gradient_steps) == 4
    assert "attention.self.key.bias has mean |gradient|" in result.message


def test_transformers_default_out_dir_and_bad_options(tmp_path):
    with pytest.raises(MltraceValueError, match="unknown hook option.*'sav_config'.*save_config"):
        MltraceCallback(sav_config=None)
    with pytest.raises(MltraceValueError, match="step_boundary"):
        MltraceCallback(step_boundary="forward")
    callback = MltraceCallback(include_collections=["losses"])
    trainer = hf_trainer(tmp_path, callback, max_steps=2)
    trainer.train()
    callback.close()
    trial = create_trial(str(tmp_path / "hf" / "mltrace"))
    # smdebug's default save interval (500 steps) saves step 0's losses; the Trainer's logged
    # metrics are saved whenever it logs (step 1 holds only them).
    assert trial.tensor("loss_output_1").steps(mode=TRAIN) == [0]
    assert trial.tensor("loss").steps(mode=TRAIN) == [0, 1]
    assert trial.steps(mode=TRAIN) == [0, 1]


def test_transformers_shares_the_mlflow_callbacks_run(tracking, tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    callback = MltraceCallback(out_dir=str(tmp_path / "trial"), save_config=mltrace.SaveConfig(save_interval=1),
                               include_collections=COLLECTIONS, mlflow={"system_metrics": True})
    trainer = hf_trainer(tmp_path, callback, report_to="mlflow")
    trainer.train()
    callback.close()
    mlflow.flush_async_logging()

    client = MlflowClient(tracking)
    runs = client.search_runs(["0"])
    assert len(runs) == 1, "mltrace and MLflowCallback log into one run"
    run = runs[0]
    assert run.info.status == "FINISHED"
    with open(tmp_path / "trial" / paths.MLFLOW_RUN_FILE) as f:
        assert json.load(f)["run_id"] == run.info.run_id
    assert run.data.tags["mltrace.trial"] == str(tmp_path / "trial")
    assert run.data.params["gradient_accumulation_steps"] == "2"  # MLflowCallback's params
    assert "mltrace.include_collections" in run.data.params  # mltrace's
    # The Trainer's metrics are MLflowCallback's (at its global_step), logged once each.
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4]
    assert "eval/eval_loss" not in run.data.metrics
    # mltrace's own: each micro-batch's loss per TRAIN step (at its global step).
    trained = create_trial(str(tmp_path / "trial")).tensor("loss_output_1").steps()
    assert len(trained) == 4
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss_output_1")] == trained
    # MLflow's system metrics in the same run.
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"):
        assert client.get_metric_history(run.info.run_id, key), f"{key} missing: {sorted(run.data.metrics)}"


# -- Lightning --------------------------------------------------------------------------------------
class Regressor(L.LightningModule):
    """y = sum(x): two linear layers, MSE, SGD; logs its losses with self.log."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log_dict({"val_loss": loss, "val_mae": (self(x) - y).abs().mean()})
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def loader(n: int, batch: int, seed: int = 0) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch)


@pytest.fixture
def mlflow_logger_uri(monkeypatch):
    """MLFlowLogger calls mlflow.set_tracking_uri (process-wide): undone after the test."""
    yield
    import mlflow

    mlflow.set_tracking_uri(None)


def pl_trainer(tmp_path, callback, logger=False) -> L.Trainer:
    return L.Trainer(max_epochs=2, accumulate_grad_batches=2, callbacks=[callback], logger=logger,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path / "pl"), limit_val_batches=2, accelerator="cpu",
                     log_every_n_steps=1)


def test_lightning_saves_each_optimizer_step_in_its_loop_mode(tmp_path):
    torch.manual_seed(0)
    callback = LightningCallback(out_dir=str(tmp_path / "trial"), save_config=mltrace.SaveConfig(save_interval=1),
                                 include_collections=COLLECTIONS, export_tensorboard=True)
    trainer = pl_trainer(tmp_path, callback)
    model = Regressor()
    trainer.fit(model, loader(32, 8), loader(32, 8, seed=1))  # 4 batches: 2 optimizer steps per epoch
    assert create_trial(str(tmp_path / "trial")).steps(mode=TRAIN) == [0, 1, 2, 3]  # before close
    trainer.test(model, loader(16, 8, seed=2))
    trainer.predict(model, loader(16, 16, seed=3))
    callback.close()
    assert "log" not in vars(model)  # the module's own log is back

    trial = create_trial(str(tmp_path / "trial"))
    assert trainer.global_step == 4 and trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    # validation after each epoch (2 batches; the sanity check is not recorded) and test: EVAL
    assert trial.steps(mode=EVAL) == [0, 1, 2, 3, 4, 5]
    assert trial.steps(mode=PREDICT) == [0]
    check_optimizer_steps(trial, "Regressor_", trial.steps(mode=TRAIN))

    # Each TRAIN step holds its two batches' losses; self.log's value is the first batch's one.
    assert trial.tensor("loss_output_1").steps(mode=TRAIN) == [0, 1, 2, 3]
    for step in trial.steps(mode=TRAIN):
        assert float(trial.tensor("train_loss").value(step, mode=TRAIN)) == pytest.approx(
            float(trial.tensor("loss_output_0").value(step, mode=TRAIN)), rel=1e-5)
    metrics = set(trial.tensor_names(collection="metrics"))
    assert {"train_loss", "val_loss", "val_mae", "test_loss"} <= metrics
    assert trial.tensor("val_loss").steps(mode=EVAL) == [0, 1, 2, 3]
    assert trial.tensor("test_loss").steps(mode=EVAL) == [4, 5]

    # hook options pass through: TensorBoard scalars of the logged metrics, per mode
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for mode, tag in (("TRAIN", "train_loss"), ("EVAL", "val_loss")):
        events = EventAccumulator(str(tmp_path / "trial" / "tensorboard" / mode))
        events.Reload()
        assert tag in events.Tags()["scalars"], (mode, events.Tags()["scalars"])

    rule = LossNotDecreasing(trial, use_losses_collection=True, num_steps=2, diff_percent=0.0)
    result = invoke_rule(rule, end_step=max(trial.steps()) + 1)
    assert result.evaluated_steps == len(trial.steps()) and result.error is None
    quiet = invoke_rule(VanishingGradient(trial, threshold=1e-12), end_step=max(trial.steps()) + 1)
    assert quiet.fired_steps == []


def test_lightning_shares_the_mlflow_loggers_run(tracking, tmp_path, monkeypatch, mlflow_logger_uri):
    from lightning.pytorch.loggers import MLFlowLogger

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")
    torch.manual_seed(0)
    logger = MLFlowLogger(experiment_name="lightning", tracking_uri=tracking)
    callback = LightningCallback(out_dir=str(tmp_path / "trial"), save_config=mltrace.SaveConfig(save_interval=1),
                                 include_collections=COLLECTIONS, mlflow={"system_metrics": True})
    trainer = pl_trainer(tmp_path, callback, logger=logger)
    trainer.fit(Regressor(), loader(256, 8), loader(32, 8, seed=1))
    callback.close()

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("lightning")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == logger.run_id
    run = runs[0]
    assert run.data.tags["mltrace.trial"] == str(tmp_path / "trial")
    # train_loss is the logger's (at Lightning's step), not logged a second time by mltrace
    logged = client.get_metric_history(run.info.run_id, "train_loss")
    assert len(logged) == trainer.global_step  # the logger's one point per optimizer step
    assert "eval/val_loss" not in run.data.metrics
    trained = create_trial(str(tmp_path / "trial")).tensor("loss_output_1").steps()
    assert len(trained) == trainer.global_step
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss_output_1")] == trained
    assert client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")


def test_lightning_mlflow_logger_on_a_file_store_never_stops_training(tmp_path, monkeypatch, caplog,
                                                                     mlflow_logger_uri):
    """MLFlowLogger's default store is MLflow's deprecated file store, which mltrace refuses:
    mltrace says so and why, and training and the trial go on."""
    from lightning.pytorch.loggers import MLFlowLogger

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 refuses it by default
    logger = MLFlowLogger(experiment_name="files", tracking_uri=f"file:{tmp_path / 'mlruns'}")
    callback = LightningCallback(out_dir=str(tmp_path / "trial"), save_config=mltrace.SaveConfig(save_interval=1))
    trainer = pl_trainer(tmp_path, callback, logger=logger)
    trainer.fit(Regressor(), loader(32, 8), loader(16, 8, seed=1))
    callback.close()
    assert "mltrace does not log to MLflow" in caplog.text and "file store" in caplog.text
    assert create_trial(str(tmp_path / "trial")).steps(mode=TRAIN) == [0, 1, 2, 3]
    assert callback.hook.sinks == []


def test_transformers_model_init_registers_the_model_at_train_begin(tmp_path):
    """A Trainer built with model_init (hyperparameter search) has no model at on_init_end."""
    callback = MltraceCallback(out_dir=str(tmp_path / "trial"), save_config=mltrace.SaveConfig(save_interval=1),
                               include_collections=["gradients", "losses"])
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=4, max_steps=2,
                             report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)
    Trainer(model_init=tiny_bert, args=args, train_dataset=Tokens(16, 1), callbacks=[callback]).train()
    callback.close()
    trial = create_trial(str(tmp_path / "trial"))
    assert trial.steps(mode=TRAIN) == [0, 1]
    assert trial.tensor("gradient/BertForSequenceClassification_classifier.weight").steps(mode=TRAIN) == [0, 1]


def test_a_rules_stop_training_action_stops_the_lightning_trainer(tmp_path):
    """A rule run on the live trial fires with the stoptraining action: the next batch sees the
    stop signal and Lightning ends fit there; the trial holds the steps trained."""
    out = str(tmp_path / "trial")

    class RuleAtStep2(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 2 and not getattr(self, "done", False):
                self.done = True
                rule = VanishingGradient(create_trial(out), threshold=1e6, action_str='{"name": "stoptraining"}')
                # step 1 is still open (written when step 2 begins): the rule reads step 0
                assert invoke_rule(rule, end_step=1).fired_steps == [0]

    torch.manual_seed(0)
    callback = LightningCallback(out_dir=out, save_config=mltrace.SaveConfig(save_interval=1),
                                 include_collections=["gradients"], stop_check_interval=0.0)
    trainer = L.Trainer(max_epochs=2, accumulate_grad_batches=2, callbacks=[callback, RuleAtStep2()],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path / "pl"), accelerator="cpu",
                        limit_val_batches=0)
    trainer.fit(Regressor(), loader(128, 8))  # 16 optimizer steps without the rule
    callback.close()
    # The signal is seen when step 2 begins; Lightning stops after that batch (its first
    # micro-batch: no optimizer step), whose loss is the last thing saved.
    assert trainer.global_step == 2
    trial = create_trial(out)
    assert trial.steps(mode=TRAIN) == [0, 1, 2]
    assert trial.tensor("gradient/Regressor_fc1.weight").steps(mode=TRAIN) == [0, 1]


def test_a_rules_stop_training_action_stops_the_transformers_trainer(tmp_path):
    out = str(tmp_path / "trial")

    class RuleAtStep2(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                rule = VanishingGradient(create_trial(out), threshold=1e6, action_str='{"name": "stoptraining"}')
                assert invoke_rule(rule, end_step=1).fired_steps == [0]

    callback = MltraceCallback(out_dir=out, save_config=mltrace.SaveConfig(save_interval=1),
                               include_collections=["gradients"], stop_check_interval=0.0)
    trainer = hf_trainer(tmp_path, callback, max_steps=8)
    trainer.add_callback(RuleAtStep2())
    trainer.args.eval_strategy = "no"
    trainer.train()
    callback.close()
    assert trainer.state.global_step == 2
    assert create_trial(out).steps(mode=TRAIN) == [0, 1, 2]
