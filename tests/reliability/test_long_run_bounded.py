"""A long run saved every step keeps the hook's, writer's and storage's per-step bookkeeping
bounded, and writes exactly the files it should. No timing and no RSS here (both flaky): the
memory itself is measured by bench/long_run.py, which found LocalStorage remembering every
step's events folder (one path a step, ~1.9 MiB over 9,000 steps)."""

from __future__ import annotations

import os
import queue
from collections import deque

import pytest
import torch
from torch import nn

import mltrace.pytorch as smd
from mltrace.format import paths
from mltrace.storage import atomic_files
from mltrace.writer import process as writer_process

STEPS = 2000
EARLY = 500
SLACK = 64  # a container may fill up to this size (a cache) without counting as growth


def _container_sizes(hook: smd.Hook) -> dict[str, int]:
    """len() of every container attribute of the hook, its writer, storage and collections."""
    owners = [("hook", hook), ("writer", hook.writer), ("storage", hook.storage)]
    collections = hook.collection_manager.get_collections()
    owners += [(f"collection[{n}]", c) for n, c in collections.items()]
    sizes = {}
    for owner, obj in owners:
        for attr, value in vars(obj).items():
            if isinstance(value, (list, dict, set, frozenset, tuple, deque, bytearray)):
                sizes[f"{owner}.{attr}"] = len(value)
            elif isinstance(value, queue.Queue):
                sizes[f"{owner}.{attr}"] = value.qsize()
    return sizes


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_long_run_keeps_per_step_state_bounded_and_writes_every_file(tmp_path, monkeypatch, writer):
    monkeypatch.setenv(writer_process.WRITER_ENV, writer)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = tmp_path / "trial"
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    early: dict[str, int] = {}
    for step in range(STEPS):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        hook.save_scalar("lr", 0.01)
        if step + 1 == EARLY:
            early = _container_sizes(hook)
    late = _container_sizes(hook)

    grown = {k: (early.get(k, 0), v) for k, v in late.items() if v > max(early.get(k, 0), SLACK)}
    assert not grown, f"containers growing with the steps (size at step {EARLY}, {STEPS}): {grown}"
    # The candidates bench/long_run.py looks at, named, so that a failure says which one.
    assert (hook.writer._process is not None) == (writer == "process")
    assert len(hook.storage.files.made_dirs) <= atomic_files.MADE_DIRS_KEPT
    assert len(hook.outputs.written) <= 9  # 2 weights, 2 biases, 4 gradients, 1 loss
    assert hook.plan.memo_size <= 16
    assert hook.nan_watch.held == [] and len(hook.outputs.pending_scalars) <= 1
    assert hook.writer.failures.messages == []
    assert all(len(c.tensor_names) <= 9 for c in hook.collection_manager.get_collections().values())

    hook.close()
    files = sorted(
        os.path.relpath(os.path.join(d, n), out).replace(os.sep, "/")
        for d, _, names in os.walk(out) for n in names
    )
    worker = paths.DEFAULT_WORKER_NAME
    per_step = [(paths.event_file_key(s, worker), paths.index_file_key(s, worker))
                for s in range(STEPS)]
    once = [paths.collections_file_key(worker), f"{paths.WORKERS_DONE_DIR}/{worker}",
            paths.END_OF_JOB_MARKER]
    expected = sorted([k for pair in per_step for k in pair] + once)
    assert len(files) == 2 * STEPS + 3
    assert files == expected
