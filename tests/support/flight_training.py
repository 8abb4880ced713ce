"""A PyTorch run that turns NaN at a chosen step, with a flight recorder, for the recorder's tests
(tests/capture/test_flight_recorder.py) and real smdebug's read of what it dumped (tests/legacy).

The model is an MLP of four linear layers; ``fc2`` (in the middle) can be told to poison its
output with NaN at one step, as a numerically broken layer would. Saving every 500 steps, the
trial would hold step 0 and nothing else; the recorder must dump the steps around the poisoned
one and name ``fc2_output_0`` as the first tensor that was not finite.

``python -m tests.support.flight_training OUT_DIR SPEC_JSON`` runs ``train`` in a child process (the
exception and full-disk tests), with ``fault`` in the spec: ``"raise"`` raises RuntimeError at
``poison_step`` (not caught: the interpreter's excepthook runs), ``"disk_full"`` lowers
RLIMIT_FSIZE at ``poison_step`` (of the trial writer's process too) so that the dump cannot be
written.
"""

from __future__ import annotations

import json
import logging
import resource
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import mltrace.pytorch as smd
from tests.support.fault_training import limit_file_size
from tests.support.flight_records import FIVE_REDUCTIONS

POISONED = "fc2_output_0"
ACTIVATIONS = r"^(fc\d|relu\d)_output_0$"


class Faulty(nn.Linear):
    """A linear layer whose output turns NaN while ``fault`` is set."""

    fault = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * float("nan") if self.fault else out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.relu1 = nn.Linear(8, 16), nn.ReLU()
        self.fc2, self.relu2 = Faulty(16, 16), nn.ReLU()
        self.fc3, self.relu3 = nn.Linear(16, 16), nn.ReLU()
        self.fc4 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.fc1(x))
        x = self.relu2(self.fc2(x))
        return self.fc4(self.relu3(self.fc3(x)))


@dataclass
class Run:
    """What a run did: its steps, the recorder's and the losses training computed."""

    steps: int
    poison_step: int | None
    losses: list[float] = field(default_factory=list)
    max_ring_bytes: int = 0


def train(out_dir: str, steps: int, poison_step: int | None, recorder: Any = True,
          fault: str = "nan", loss_scale_at: int | None = None, on_step: Any = None,
          close: bool = True, **hook_args: Any) -> Run:
    """Train ``steps`` steps saving every 500 (losses only), the recorder keeping gradients,
    activations and losses; at ``poison_step`` ``fault`` happens ("nan": fc2's output turns NaN
    for that step only; "raise": a RuntimeError escapes; "disk_full": the file size limit drops
    and fc2 turns NaN). ``loss_scale_at``: the targets are 1000x larger at that step (a loss
    spike). ``on_step(hook, step)`` runs after each step's backward."""
    torch.manual_seed(0)
    smd.get_collection("activations").include(ACTIVATIONS)
    config = recorder if not isinstance(recorder, bool) else smd.FlightRecorderConfig(
        steps=20, after_steps=5, collections=["gradients", "activations", "losses"],
        reductions=list(FIVE_REDUCTIONS))
    hook_args.setdefault("save_config", smd.SaveConfig(save_interval=500))
    hook = smd.Hook(out_dir=out_dir, include_collections=["losses"], flight_recorder=config,
                    **hook_args)
    model, loss_fn = Net(), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1)
    run = Run(steps, poison_step)
    for step in range(steps):
        x = torch.randn(32, 8, generator=data)
        y = torch.randn(32, 1, generator=data) * (1000.0 if step == loss_scale_at else 1.0)
        if step == poison_step:
            if fault == "raise":
                model(x)
                raise RuntimeError(f"injected failure at step {step}")
            if fault == "disk_full":  # for this process and its trial writer's process
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                limit_file_size(2048, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
        model.fc2.fault = step == poison_step and fault != "raise"
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if step != poison_step:
            opt.step()  # a NaN step's update is skipped, as GradScaler or a guard would
        run.losses.append(loss.item())
        if on_step is not None:
            on_step(hook, step)
        if hook.recorder is not None:
            run.max_ring_bytes = max(run.max_ring_bytes, hook.recorder.ring_bytes)
    if close:
        hook.close()
    return run


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    out_dir, spec = argv[0], json.loads(argv[1])
    run = train(out_dir, **spec)
    print(json.dumps({"losses": run.losses}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
