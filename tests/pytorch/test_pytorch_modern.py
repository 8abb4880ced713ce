"""PyTorch as trained today, single process: torch.compile (no graph break, at most two graph
variants, the eager run's values), GradScaler (unscaled gradients, skipped steps marked),
gradient accumulation (``step_boundary="optimizer"``), activation checkpointing (outputs saved
once), bf16, and tensor subclasses (one warning, the hook stays on).

Compiled runs use the ``aot_eager`` backend: graph breaks and graph variants are decided by
TorchDynamo before any backend runs, and it keeps the suite fast on CPU; bench/pytorch_compile.py
measures inductor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import mltrace.pytorch as smd
from mltrace.rules.builtin.exploding_tensor import NaNInfDetected
from mltrace.trials import create_trial

torch._dynamo = pytest.importorskip("torch._dynamo")  # noqa: SLF001
from torch._dynamo.utils import counters  # noqa: E402

COLLECTIONS = ["weights", "biases", "gradients", "losses"]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))


def _data(steps: int, batch: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 8, generator=gen), torch.randn(batch, 1, generator=gen))
            for _ in range(steps)]


def _train(out: Path, compile_at: str | None, steps: int = 20, **hook_kwargs: Any) -> dict[str, Any]:
    """Train the MLP with a hook (``compile_at``: None, "before" or "after" registration)."""
    torch._dynamo.reset()
    counters.clear()
    model, loss_fn = _mlp(), nn.MSELoss()
    hook_kwargs.setdefault("include_collections", COLLECTIONS)
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=5), **hook_kwargs)
    if compile_at == "before":
        hook.register_module(model)
    called = torch.compile(model, backend="aot_eager") if compile_at else model
    if compile_at != "before":
        hook.register_module(called)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in _data(steps):
        opt.zero_grad()
        loss_fn(called(x), y).backward()
        opt.step()
    hook.close()
    return {"breaks": sum(counters["graph_break"].values()),
            "graphs": counters["stats"]["unique_graphs"], "hook": hook}


def _values(out: Path) -> dict[tuple[str, int], np.ndarray]:
    trial = create_trial(str(out))
    return {(name, step): trial.tensor(name).value(step)
            for name in trial.tensor_names() for step in trial.tensor(name).steps()}


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=str(key))


# -- torch.compile ---------------------------------------------------------------------------------
@pytest.mark.parametrize("compile_at", ["before", "after"])
def test_compiled_model_saves_the_eager_values_without_graph_breaks(tmp_path: Path,
                                                                     compile_at: str) -> None:
    _train(tmp_path / "eager", None)
    run = _train(tmp_path / compile_at, compile_at)
    # Registered after compiling: the step boundary hooks sit on the OptimizedModule, outside
    # Dynamo. Registered before: Dynamo meets them while tracing Module.__call__ of the first
    # call, skips that frame once (one break at compile time, not per step: 40 steps give the
    # same count as 20) and runs them eagerly from then on.
    assert run["breaks"] == (0 if compile_at == "after" else 1)
    assert run["graphs"] == 1  # the model alone compiles to one graph
    if compile_at == "before":
        assert _train(tmp_path / "longer", compile_at, steps=40)["breaks"] == 1
    eager = _values(tmp_path / "eager")
    assert ("gradient/Sequential_0.weight", 15) in eager and ("MSELoss_output_0", 5) in eager
    _assert_same(_values(tmp_path / compile_at), eager)


def test_compiled_module_outputs_are_saved_with_two_graph_variants(tmp_path: Path) -> None:
    kwargs = {"include_regex": ["^1_output", "^2_input"]}
    _train(tmp_path / "eager", None, **kwargs)
    run = _train(tmp_path / "compiled", "after", **kwargs)
    assert run["breaks"] == 0
    assert run["graphs"] <= 2  # a save step and a skip step
    eager = _values(tmp_path / "eager")
    assert {name for name, _ in eager} >= {"1_output_0", "2_input_0"}
    _assert_same(_values(tmp_path / "compiled"), eager)


def test_registering_the_model_and_its_compiled_wrapper_is_one_registration(tmp_path: Path) -> None:
    model = _mlp()
    hook = smd.Hook(out_dir=str(tmp_path))
    hook.register_module(torch.compile(model, backend="aot_eager"))
    with pytest.raises(Exception, match="already registered"):
        hook.register_module(model)
    hook.close()

def test_a_graph_compiled_before_registration_is_named_and_the_wrapper_still_works(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """torch.compile skips hook guards on modules: after one model ran compiled, a second of the
    same structure registered before compiling reuses the first graph, and its forward never
    calls the hook. mltrace says so (and what to do) instead of saving nothing in silence."""
    torch._dynamo.reset()
    first = torch.compile(_mlp(), backend="aot_eager")
    first(torch.randn(4, 8)).sum().backward()

    with caplog.at_level(logging.WARNING, logger="mltrace.pytorch"):
        stale = _train_without_reset(tmp_path / "stale", compile_at="before")
    assert stale.step == -1  # the reused graph never ran the hook's step boundary
    warned = [r.getMessage() for r in caplog.records if "without mltrace's callbacks" in r.getMessage()]
    assert len(warned) == 1 and "hook.register_module(torch.compile(model))" in warned[0]

    wrapper = _train_without_reset(tmp_path / "wrapper", compile_at="after")  # what it advises
    assert wrapper.step == 9
    assert create_trial(str(tmp_path / "wrapper")).tensor("gradient/Sequential_0.weight").steps() == [0, 5]
    torch._dynamo.reset()


def _train_without_reset(out: Path, compile_at: str) -> smd.Hook:
    model, loss_fn = _mlp(), nn.MSELoss()
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=5),
                    include_collections=COLLECTIONS)
    if compile_at == "before":
        hook.register_module(model)
    called = torch.compile(model, backend="aot_eager")
    if compile_at == "after":
        hook.register_module(called)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in _data(10):
        opt.zero_grad()
        loss_fn(called(x), y).backward()
        opt.step()
    hook.close()
    return hook



# -- mixed precision -------------------------------------------------------------------------------
def _scaled_run(out: Path, scaler: torch.amp.GradScaler | None, poison_step: int | None = None,
                **hook_kwargs: Any) -> smd.Hook:
    model, loss_fn = _mlp(), nn.MSELoss()
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=COLLECTIONS, **hook_kwargs)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if scaler is not None:
        hook.register_grad_scaler(scaler)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(_data(6)):
        if step == poison_step:
            x = x.clone()
            x[0, 0] = float("inf")
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    hook.close()
    return hook


def test_grad_scaler_gradients_are_saved_unscaled(tmp_path: Path) -> None:
    _scaled_run(tmp_path / "plain", None)
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    _scaled_run(tmp_path / "scaled", scaler)
    plain, scaled = _values(tmp_path / "plain"), _values(tmp_path / "scaled")
    for key, value in plain.items():
        np.testing.assert_allclose(scaled[key], value, rtol=1e-5, atol=1e-7, err_msg=str(key))
    assert scaled[("GradScaler_scale", 0)] == 65536.0
    assert all(scaled[("GradScaler_step_skipped", s)] == 0 for s in range(6))
    assert scaler.step.__func__ is torch.amp.GradScaler.step  # type: ignore[attr-defined]  # handed back at close


def test_a_step_the_scaler_skipped_is_marked_and_its_nonfinite_gradients_stay(tmp_path: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    _scaled_run(tmp_path, scaler, poison_step=3)
    values = _values(tmp_path)
    skipped = [s for s in range(6) if values[("GradScaler_step_skipped", s)] == 1]
    assert skipped == [3]
    assert values[("GradScaler_scale", 4)] == values[("GradScaler_scale", 3)] / 2  # backed off
    assert not np.isfinite(values[("gradient/Sequential_0.weight", 3)]).all()
    rule = NaNInfDetected(create_trial(str(tmp_path)), collection_names=["gradients"])
    assert not rule.invoke_at_step(2)
    assert rule.invoke_at_step(3)


# -- gradient accumulation -------------------------------------------------------------------------
def _accumulating_run(out: Path, step_boundary: str, micro: int = 4, steps: int = 3) -> list[dict]:
    model, loss_fn = _mlp(), nn.MSELoss()
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=COLLECTIONS, step_boundary=step_boundary)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = iter(_data(micro * steps))
    accumulated = []
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(micro):
            x, y = next(data)
            (loss_fn(model(x), y) / micro).backward()
        accumulated.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    hook.close()
    return accumulated


def test_optimizer_step_boundary_saves_accumulated_gradients(tmp_path: Path) -> None:
    accumulated = _accumulating_run(tmp_path, "optimizer")
    trial = create_trial(str(tmp_path))
    assert trial.steps() == [0, 1, 2]  # one step per optimizer step
    grad = trial.tensor("gradient/Sequential_0.weight")
    for step, grads in enumerate(accumulated):
        np.testing.assert_allclose(grad.value(step), grads["0.weight"].numpy(), rtol=1e-6)
    losses = sorted(n for n in trial.tensor_names() if n.startswith("MSELoss"))
    assert losses == [f"MSELoss_output_{i}" for i in range(4)]  # each micro-batch's loss


def test_default_step_boundary_stays_one_forward_per_step(tmp_path: Path) -> None:
    _accumulating_run(tmp_path, "forward")
    assert create_trial(str(tmp_path)).steps() == list(range(12))


def test_unknown_step_boundary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="step_boundary='backward'.*optimizer"):
        smd.Hook(out_dir=str(tmp_path), step_boundary="backward")


# -- activation checkpointing, bf16, tensor subclasses ----------------------------------------------
class _Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.body = _mlp()
        self.use_reentrant = use_reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.body, x, use_reentrant=self.use_reentrant)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_saves_outputs_once(tmp_path: Path, use_reentrant: bool) -> None:
    model = _Checkpointed(use_reentrant)
    hook = smd.Hook(out_dir=str(tmp_path), save_config=smd.SaveConfig(save_interval=1),
                    include_regex=["body.1_output"])
    hook.register_module(model)
    outputs = []
    model.body[1].register_forward_hook(lambda m, i, o: outputs.append(o.detach().clone()))
    for x, _ in _data(3):
        x.requires_grad_(use_reentrant)  # the reentrant variant needs an input that requires grad
        model(x).sum().backward()
    hook.close()
    trial = create_trial(str(tmp_path))
    assert trial.tensor_names() == ["body.1_output_0"]  # no _output_1 from the recomputation
    assert trial.steps() == [0, 1, 2]
    np.testing.assert_array_equal(trial.tensor("body.1_output_0").value(2), outputs[-2].numpy())


def test_bf16_parameters_and_autocast(tmp_path: Path) -> None:
    model, loss_fn = _mlp().to(torch.bfloat16), nn.MSELoss()
    hook = smd.Hook(out_dir=str(tmp_path), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=COLLECTIONS)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for x, y in _data(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x.bfloat16()), y.bfloat16())
        loss.backward()
    hook.close()
    trial = create_trial(str(tmp_path))
    weight = trial.tensor("Sequential_0.weight").value(1)
    np.testing.assert_array_equal(weight.astype(np.float32), model[0].weight.float().detach().numpy())
    assert trial.tensor("gradient/Sequential_4.bias").value(1).shape == (1,)


class _Odd(torch.Tensor):
    """A tensor subclass that refuses to become numpy, as some libraries' wrappers do."""

    def numpy(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise RuntimeError(".numpy() is not supported for tensor subclasses.")

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.Tensor.sum, torch.linalg.vector_norm) or getattr(func, "__name__", "") in ("min", "max"):
            raise RuntimeError(f"{func.__name__} is not supported by _Odd")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_an_unsupported_tensor_subclass_warns_once_and_the_hook_stays_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = _mlp()
    model[0].weight = nn.Parameter(model[0].weight.detach().as_subclass(_Odd))
    hook = smd.Hook(out_dir=str(tmp_path), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases"])
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        for x, _ in _data(3):
            model(x)
    hook.close()
    assert not hook.disabled
    warnings = [r.getMessage() for r in caplog.records if "Sequential_0.weight" in r.getMessage()]
    assert len(warnings) == 1 and "_Odd" in warnings[0] and "as_subclass" in warnings[0]
    trial = create_trial(str(tmp_path))
    assert "Sequential_2.weight" in trial.tensor_names() and trial.steps() == [0, 1, 2]
