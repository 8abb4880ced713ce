"""Trials written with a fixed clock, for byte-for-byte comparisons of the writer across
versions: tests/format/golden/ holds what the writer before the batch encoder
(mltrace.format.event_batch) wrote from the same calls, and tests/format/test_event_batch.py
writes them again and compares every file.

Only calls that both versions have are used: ``TrialWriter.add_tensor`` and the PyTorch hook.
Run as a script to write the golden trials: ``python -m tests.support.golden_trials DIR``.
"""

from __future__ import annotations

import os
import sys
from unittest import mock

import numpy as np

#: the clock every record gets (the writer reads time.time() for a record's wall time)
WALL_TIME = 1_700_000_000.25
#: every numeric dtype of the format, and the shapes that take each path of the encoder: a
#: scalar, a short vector, values past the size joined into their record, and an empty array
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
SHAPES = ((), (3,), (8, 40), (0,))


def arrays() -> list[tuple[str, np.ndarray]]:
    """(name, value) of every dtype and shape above, text and bfloat16 bits, and a
    big-endian array: every kind of value the writer encodes."""
    from mltrace.format.tensors import BFloat16Bits

    rng = np.random.default_rng(7)
    out = []
    for dtype in DTYPES:
        for shape in SHAPES:
            values = rng.normal(size=shape) * 50
            if dtype.startswith("complex"):
                values = values + 1j * values
            name = f"values/{dtype}_{'x'.join(map(str, shape)) or 'scalar'}"
            out.append((name, np.asarray(values).astype(dtype)))
    out.append(("values/bfloat16", np.arange(6, dtype=np.uint16).view(BFloat16Bits)))
    out.append(("values/text", np.array(["a", "bc"])))
    out.append(("values/bytes", np.array([b"x", b"yz"], dtype=object)))
    out.append(("values/big_endian", np.arange(5, dtype=">f4")))
    return out


def write_writer_trial(out_dir: str) -> None:
    """Two steps of every value in ``arrays()`` through TrialWriter.add_tensor."""
    from mltrace.modes import ModeKeys
    from mltrace.storage import open_storage
    from mltrace.writer import trial_writer

    with mock.patch.object(trial_writer.time, "time", lambda: WALL_TIME):
        writer = trial_writer.TrialWriter(open_storage(out_dir), "worker_0", batch_steps=False)
        for step, mode in ((0, ModeKeys.TRAIN), (1, ModeKeys.EVAL)):
            writer.open_step(step, mode, step)
            for name, value in arrays():
                writer.add_tensor(name, value, mode, step)
            writer.close_step()
        writer.close()


def write_hook_trial(out_dir: str) -> None:
    """Three steps of a small PyTorch model under a hook saving every reduction (and the
    absolute twins smdebug has) of the weights, biases and gradients of float32, float64 and bfloat16
    layers, the losses, and a raw tensor of each dtype (save_tensor)."""
    import torch

    import mltrace.pytorch as smd
    from mltrace.config import ALL_REDUCTIONS, SMDEBUG_REDUCTIONS
    from mltrace.writer import trial_writer

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc32 = torch.nn.Linear(4, 8)
            self.fc64 = torch.nn.Linear(8, 8).double()
            self.fc16 = torch.nn.Linear(8, 1).bfloat16()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc64(torch.relu(self.fc32(x)).double())
            return self.fc16(h.bfloat16()).float()

    torch.manual_seed(0)
    model = Mixed()
    # Small multiples of 1/8 as weights and inputs, batches of 4 and a step of 1/8: every sum and
    # product of the 3 steps is exact, so the values (and the files) are the same on every CPU,
    # whatever order its kernels add in.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-4, 5, p.shape) / 8)
    reductions = [r for r in ALL_REDUCTIONS if r not in ("l1", "l2")]
    config = smd.ReductionConfig(reductions=reductions, abs_reductions=[r for r in reductions if r in SMDEBUG_REDUCTIONS],
                                 norms=["l1", "l2"], abs_norms=["l1", "l2"])
    with mock.patch.object(trial_writer.time, "time", lambda: WALL_TIME):
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["weights", "biases", "gradients", "losses"],
                        reduction_config=config)
        hook.register_module(model)
        loss_fn = torch.nn.MSELoss()
        hook.register_loss(loss_fn)
        opt = torch.optim.SGD(model.parameters(), lr=0.125)
        for step in range(3):
            loss = loss_fn(model(torch.randint(-2, 3, (4, 4)).float()), torch.zeros(4, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            hook.save_tensor(f"extra/step_{step % 2}", torch.arange(4, dtype=torch.float32))
        hook.close()


def main(root: str) -> None:
    os.environ.setdefault("MLTRACE_WRITER", "thread")
    write_writer_trial(os.path.join(root, "writer"))
    write_hook_trial(os.path.join(root, "hook"))


if __name__ == "__main__":
    main(sys.argv[1])
