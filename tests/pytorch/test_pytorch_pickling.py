"""A hooked model pickles, copies and spawns as the user's model, without the hook (issue 34):
``torch.save(model)``, ``pickle.dumps``, ``copy.deepcopy`` and a ``torch.multiprocessing``
spawn, before and after training steps, for a plain model, a compiled one and a Transformers
GPT-2. The copy holds no mltrace callback and needs no mltrace to load or train; a new hook
attaches to it; the original goes on saving with its own hook."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import mltrace.pytorch as smd
from mltrace.trials import create_trial
from tests.support.pickled_models import batch, child_trains, gpt2, hook_entries, mlp, train_step

KINDS = ("plain", "compiled", "gpt2")


def _model(kind: str) -> torch.nn.Module:
    if kind == "gpt2":
        return gpt2()
    model = mlp()
    return torch.compile(model, backend="aot_eager") if kind == "compiled" else model


def _hooked(kind: str, out_dir: str, steps: int) -> tuple[torch.nn.Module, smd.Hook]:
    model = _model(kind)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    hook.register_module(model)
    for _ in range(steps):
        train_step(model)
    return model, hook


def _trains_without_hook(model: torch.nn.Module, hook: smd.Hook) -> None:
    """``model`` (a copy) holds no hook entry, trains, and moves ``hook``'s step not at all."""
    assert hook_entries(model) == 0
    before = hook.step
    losses = [train_step(model) for _ in range(2)]
    assert all(loss == loss for loss in losses)  # finite, trained
    assert hook.step == before


def _rehooks(model: torch.nn.Module, out_dir: str) -> None:
    """A new hook registers the copy and saves its steps."""
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    hook.register_module(model)
    for _ in range(2):
        train_step(model)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1]
    assert any(name.startswith("gradient/") for name in trial.tensor_names())


@pytest.mark.parametrize("steps", [0, 2], ids=["before-training", "after-training"])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_save_pickle_and_deepcopy_leave_the_hook_out(tmp_path, kind, steps):
    model, hook = _hooked(kind, str(tmp_path / "run"), steps)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    data = pickle.dumps(model)
    assert b"mltrace" not in data  # loading needs no mltrace
    copies = {
        "torch.save": torch.load(path, weights_only=False),
        "pickle": pickle.loads(data),
        "deepcopy": copy.deepcopy(model),
    }
    for how, loaded in copies.items():
        _trains_without_hook(loaded, hook)
        _rehooks(loaded, str(tmp_path / f"again-{how}"))
    # the original keeps its callbacks and goes on saving
    entries = hook_entries(model)
    assert entries > 0
    train_step(model)
    hook.close()
    assert create_trial(str(tmp_path / "run")).steps() == list(range(steps + 1))


def test_a_spawned_process_trains_unpickled_models_without_mltrace(tmp_path):
    """torch.multiprocessing with spawn pickles the models into a fresh interpreter: there they
    train, and mltrace was never imported."""
    models = []
    for kind in KINDS:
        for steps in (0, 2):
            model, _ = _hooked(kind, str(tmp_path / f"{kind}-{steps}"), steps)
            models.append(model)
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    proc = ctx.Process(target=child_trains, args=(models, results))
    proc.start()
    proc.join(timeout=240)
    assert proc.exitcode == 0
    got = results.get()
    assert got["mltrace_imported"] == []
    assert got["hook_entries"] == [0] * len(models)
    assert all(loss == loss for loss in got["losses"])


def test_gradient_hooks_pickle_silently(tmp_path, recwarn):
    """Parameters carry mltrace's gradient hooks during a saving step; torch drops tensor hooks
    when it pickles a parameter, and does so without a warning for these."""
    model, hook = _hooked("plain", str(tmp_path / "run"), 0)
    out = model(batch(model))  # a step began: its gradient hooks are on
    loaded = pickle.loads(pickle.dumps(model))
    out.sum().backward()
    train_step(loaded)
    hook.close()
    assert not [w for w in recwarn if "hook" in str(w.message).lower()]
