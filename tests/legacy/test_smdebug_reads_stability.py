"""Real smdebug 1.0.34's reader reads a trial holding the stability collections.

mltrace's PyTorch hook trains TinyGPT (tests/support/stability_models.py) three TRAIN steps and
one EVAL step with ``include_collections=["stability", "samples", "weights"]``; smdebug's ``create_trial``
must list the signal collections and their tensors, read every value at every step exactly as
mltrace's reader does (one value per attention head, scalars as scalars; the ``samples``
collection's per-sample losses as float32 and fingerprints as int64 vectors), and keep the
signal tensors out of its own built-in collections: smdebug matches a collection's include_regex
against every tensor name, and its weights regex ``^(?!gradient).*weight`` would take
``grad_norm/TinyGPT_head.weight`` for a weight if the regex written to the trial let it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.trials import create_trial as smd_create_trial

import mltrace.pytorch as mlsmd
from mltrace.stability.samples import SAMPLES, fingerprint_name, loss_name
from mltrace.stability.signals import PREFIXES, SIGNAL_COLLECTIONS, STABILITY, parse_signal
from mltrace.trials import create_trial as ml_create_trial
from tests.support.stability_models import HEADS, TinyGPT, TokenLoss, batches

TRAIN_STEPS = 3
ATTENTION = sorted(f"attention/blocks.{i}.attn/{q}" for i in (0, 1) for q in ("max_logit", "entropy"))
#: the samples collection's tensors: each sample's loss and its input's fingerprint
SAMPLE_TENSORS = sorted([loss_name("TokenLoss"), fingerprint_name("TinyGPT")])
BATCH = 3  # tests.support.stability_models.batches' batch
#: smdebug's built-in collections a signal's name could fall into by its regexes.
BUILTIN = ("weights", "biases", "gradients", "losses", "inputs", "outputs")


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("stability") / "run"
    hook = mlsmd.Hook(out_dir=str(out), include_collections=[STABILITY, "samples", "weights"],
                      save_config=mlsmd.SaveConfig(save_interval=1))
    torch.manual_seed(0)
    model, loss_fn = TinyGPT(), TokenLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    data = batches(TRAIN_STEPS + 1)
    hook.set_mode(mlsmd.modes.TRAIN)  # without a mode, steps are GLOBAL ones (smdebug's default)
    for x, y in data[:TRAIN_STEPS]:
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hook.set_mode(mlsmd.modes.EVAL)
    with torch.no_grad():
        x, y = data[-1]
        loss_fn(model.eval()(x), y)
    hook.close()
    return str(out)


@pytest.fixture(scope="module")
def inputs() -> list[torch.Tensor]:
    """The model's input at each step: three TRAIN steps, then the EVAL one."""
    return [x for x, _ in batches(TRAIN_STEPS + 1)]


@pytest.fixture(scope="module")
def trials(out_dir):
    return smd_create_trial(out_dir), ml_create_trial(out_dir)


def _signals(names: list[str]) -> list[str]:
    return [n for n in names if parse_signal(n) is not None]


def test_smdebug_lists_the_stability_collections_and_their_tensors(trials):
    st, mt = trials
    assert {STABILITY, *SIGNAL_COLLECTIONS} <= set(st.collections())
    assert st.tensor_names(collection="attention") == mt.tensor_names(collection="attention") == ATTENTION
    for collection in (STABILITY, *SIGNAL_COLLECTIONS):
        names = st.tensor_names(collection=collection)
        assert names == mt.tensor_names(collection=collection), collection
        assert names, collection
        if collection != STABILITY:
            assert all(n.startswith(PREFIXES[collection]) for n in names), collection
    every = _signals(st.tensor_names())
    assert st.tensor_names(collection=SAMPLES) == mt.tensor_names(collection=SAMPLES) == SAMPLE_TENSORS
    assert set(every) | {"TokenLoss_output_0"} == set(st.tensor_names(collection=STABILITY))  # the samples apart


def test_smdebug_reads_every_signal_value_as_mltrace_does(trials):
    st, mt = trials
    assert st.tensor_names() == mt.tensor_names()
    signals = _signals(st.tensor_names())
    assert len(signals) > 100  # every parameter's grad norm, update and Adam state
    for name in signals:
        for mode in ("TRAIN", "EVAL"):
            steps = st.tensor(name).steps(mode=SmdModeKeys[mode])
            assert steps == mt.tensor(name).steps(mode=mode), (name, mode)
            for step in steps:
                got = st.tensor(name).value(step, mode=SmdModeKeys[mode])
                want = mt.tensor(name).value(step, mode=mode)
                assert got.dtype == want.dtype == np.float32 and got.shape == want.shape, name
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {mode} {step}")
    for name in ATTENTION:
        assert st.tensor(name).value(0, mode=SmdModeKeys.TRAIN).shape == (HEADS,)
    assert st.tensor("grad_norm/TinyGPT").value(0, mode=SmdModeKeys.TRAIN).shape == ()


def test_smdebug_reads_the_per_sample_losses_and_fingerprints(trials, inputs):
    """float32 and int64 vectors of one value per sample, at every TRAIN and EVAL step, as
    mltrace reads them; the fingerprints are mltrace.pytorch.fingerprint of each step's batch."""
    st, mt = trials
    steps = {"TRAIN": list(range(TRAIN_STEPS)), "EVAL": [0]}
    for name, dtype in ((loss_name("TokenLoss"), np.float32), (fingerprint_name("TinyGPT"), np.int64)):
        for mode, mode_steps in steps.items():
            assert st.tensor(name).steps(mode=SmdModeKeys[mode]) == mode_steps, (name, mode)
            for step in mode_steps:
                got = st.tensor(name).value(step, mode=SmdModeKeys[mode])
                want = mt.tensor(name).value(step, mode=mode)
                assert got.dtype == want.dtype == dtype and got.shape == want.shape == (BATCH,), name
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {mode} {step}")
    for i, step in enumerate(steps["TRAIN"]):
        got = st.tensor(fingerprint_name("TinyGPT")).value(step, mode=SmdModeKeys.TRAIN)
        np.testing.assert_array_equal(got, mlsmd.fingerprint(inputs[i]))
    got = st.tensor(fingerprint_name("TinyGPT")).value(0, mode=SmdModeKeys.EVAL)
    np.testing.assert_array_equal(got, mlsmd.fingerprint(inputs[-1]))
    loss = st.tensor(loss_name("TokenLoss")).value(1, mode=SmdModeKeys.TRAIN)
    assert np.mean(loss, dtype=np.float64) == pytest.approx(
        float(st.tensor("TokenLoss_output_0").value(1, mode=SmdModeKeys.TRAIN)), rel=1e-5)


def test_signals_follow_the_modes_smdebug_reads(trials):
    """Forward signals exist in EVAL too; the optimizer's only where it stepped (TRAIN)."""
    st, _ = trials
    train, evaluation = SmdModeKeys.TRAIN, SmdModeKeys.EVAL
    assert st.steps(mode=train) == list(range(TRAIN_STEPS)) and st.steps(mode=evaluation) == [0]
    assert st.tensor("attention/blocks.1.attn/max_logit").steps(mode=evaluation) == [0]
    assert st.tensor("logits/TinyGPT/log_z_max").steps(mode=evaluation) == [0]
    assert st.tensor("grad_norm/TinyGPT").steps(mode=train) == list(range(TRAIN_STEPS))
    assert st.tensor("grad_norm/TinyGPT").steps(mode=evaluation) == []


def test_smdebugs_builtin_collections_hold_no_signal(trials):
    st, _ = trials
    weights = st.tensor_names(collection="weights")
    assert "TinyGPT_head.weight" in weights and all(n.startswith("TinyGPT_") for n in weights)
    for collection in BUILTIN:
        assert not _signals(st.tensor_names(collection=collection)), collection
        assert not set(SAMPLE_TENSORS) & set(st.tensor_names(collection=collection)), collection
