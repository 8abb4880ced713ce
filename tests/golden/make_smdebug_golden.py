"""Write the golden smdebug trial that the main suite reads with mltrace (no smdebug there).

Run with the legacy venv, which has the real smdebug 1.0.34::

    .venv-legacy/bin/python tests/golden/make_smdebug_golden.py [--out DIR]

It writes ``DIR/pytorch_run/`` with ``smdebug.pytorch.Hook`` (a small seeded Linear-ReLU-Linear
model; TRAIN then EVAL steps; hook-wide reductions and norms; a module's inputs/outputs; a
reductions-only and a shape-only collection; ``save_scalar``; ``save_tensor`` of several dtypes)
and ``DIR/expected.json``: what smdebug's own reader returns for that trial (tensor names, steps
per mode, the mode of each global step, every value with dtype and shape, every stored reduction,
collections, workers), plus, under ``written``, the arrays the script handed to ``save_tensor``,
which is the truth where smdebug's reader is wrong (int8 read as uint8, int16 not readable).
DIR defaults to ``tests/golden/smdebug_1.0.34`` beside this file. Values are deterministic up
to float rounding of the CPU kernels (torch is seeded and single-threaded); event files carry
wall times, so their bytes differ between runs while index files do not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("SMDEBUG_TRAINING_END_DELAY_REFRESH", "0")

import numpy as np  # noqa: E402
import smdebug  # noqa: E402
import smdebug.pytorch as smd  # noqa: E402
import torch  # noqa: E402
from smdebug.core.modes import ModeKeys  # noqa: E402
from smdebug.exceptions import ShapeUnavailableForStep, TensorUnavailableForStep  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

SCHEDULE = [("TRAIN", 3), ("EVAL", 2)]
READ_MODES = ("TRAIN", "EVAL", "GLOBAL")
# Passed to save_tensor at every TRAIN step.
WRITTEN = {
    "dtype_float64": np.array([0.1, -2.5, 1e-300]),
    "dtype_int32": np.array([[-(2**31), 7], [0, 2**31 - 1]], dtype=np.int32),
    "dtype_int64": np.array([-(2**62), 2**62], dtype=np.int64),
    "dtype_uint8": np.array([0, 128, 255], dtype=np.uint8),
    "dtype_bool": np.array([True, False, True]),
    "dtype_str": np.array(["alpha", "héllo", ""]),
    "dtype_int8": np.array([-128, -1, 0, 127], dtype=np.int8),  # smdebug's reader: uint8
    "dtype_int16": np.array([-300, 300], dtype=np.int16),  # smdebug's reader: KeyError
}
SMDEBUG_MISREADS = ("dtype_int8", "dtype_int16")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 5)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def write_run(run_dir: Path) -> None:
    """Train a few steps with smdebug's hook writing into ``run_dir``."""
    torch.manual_seed(20231031)
    torch.set_num_threads(1)
    model = Net()
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    hook = smd.Hook(
        out_dir=str(run_dir),
        save_config=smd.SaveConfig(save_interval=1),
        reduction_config=smd.ReductionConfig(
            reductions=["min", "max", "mean", "std"], abs_reductions=["mean"], norms=["l1", "l2"],
            save_raw_tensor=True),
        include_collections=["weights", "biases", "gradients", "losses", "relu_io", "fc1_stats",
                             "shapes", "dtypes"],
        include_regex=["^fc2_output_"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    relu_io = hook.get_collection("relu_io")
    relu_io.add_module_tensors(model.relu, inputs=True, outputs=True)
    relu_io.reduction_config = smd.ReductionConfig(save_raw_tensor=True)
    fc1_stats = hook.get_collection("fc1_stats")
    fc1_stats.add_module_tensors(model.fc1, outputs=True)
    fc1_stats.reduction_config = smd.ReductionConfig(
        reductions=["max", "variance"], abs_reductions=["sum"], abs_norms=["l2"],
        save_raw_tensor=False)
    shapes = hook.get_collection("shapes")
    shapes.include("^Net_output_")
    shapes.reduction_config = smd.ReductionConfig(save_shape=True)
    hook.get_collection("dtypes").include("^dtype_")

    step = 0
    for mode, n in SCHEDULE:
        hook.set_mode(getattr(smd.modes, mode))
        for _ in range(n):
            x = torch.randn(4, 4)
            y = torch.randint(0, 3, (4,))
            if mode == "TRAIN":
                for name, value in WRITTEN.items():
                    hook.save_tensor(name, value, "dtypes")
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                hook.save_scalar("lr", 0.25 / (1 + step))
            else:
                with torch.no_grad():
                    loss_fn(model(x), y)
            step += 1
    hook.close()


def encode_array(value: np.ndarray) -> dict:
    """An array as JSON: dtype string, shape, nested lists (strings stay strings)."""
    value = np.asarray(value)
    return {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.tolist()}


def read_expected(run_dir: Path) -> dict:
    """Everything smdebug's own reader says about the trial."""
    trial = create_trial(str(run_dir))
    names = trial.tensor_names()
    out: dict = {
        "smdebug_version": smdebug.__version__,
        "numpy_version": np.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "trial": run_dir.name,
        "workers": trial.workers(),
        "num_workers": trial.num_workers,
        "modes": sorted(m.name for m in trial.modes()),
        "steps": {m: trial.steps(mode=ModeKeys[m]) for m in READ_MODES},
        "mode_of_global_step": {
            str(g): [trial.mode(g).name, trial.mode_step(g)] for g in trial.steps()},
        "tensor_names": names,
        "tensor_names_by_step": {
            m: {str(s): trial.tensor_names(step=s, mode=ModeKeys[m])
                for s in trial.steps(mode=ModeKeys[m])}
            for m in ("TRAIN", "EVAL")},
        "collections": {name: c.to_json_dict() for name, c in sorted(trial.collections().items())},
        "tensors_in_collection": {
            name: trial.tensor_names(collection=name) for name in sorted(trial.collections())},
        "tensors": {},
        "written": {name: encode_array(value) for name, value in WRITTEN.items()},
        "smdebug_misreads": {},
    }
    for name in names:
        tensor = trial.tensor(name)
        entry: dict = {"steps": {m: tensor.steps(mode=ModeKeys[m]) for m in READ_MODES},
                       "values": {}, "shapes": {}, "reductions": {}}
        for mode in ("TRAIN", "EVAL"):
            values, shapes, reductions = {}, {}, {}
            for s in tensor.steps(mode=ModeKeys[mode]):
                try:
                    shapes[str(s)] = list(tensor.shape(s, mode=ModeKeys[mode]))
                except ShapeUnavailableForStep:
                    shapes[str(s)] = None
                except KeyError:  # smdebug cannot decode the dtype (int16)
                    shapes[str(s)] = None
                if name in SMDEBUG_MISREADS:
                    values[str(s)] = None
                else:
                    try:
                        values[str(s)] = encode_array(tensor.value(s, mode=ModeKeys[mode]))
                    except TensorUnavailableForStep:
                        values[str(s)] = None
                reds = tensor.reduction_values(s, mode=ModeKeys[mode])
                reductions[str(s)] = [
                    {"name": red, "abs": abs_, **encode_array(val)}
                    for (red, abs_), val in sorted(reds.items())]
            entry["values"][mode] = values
            entry["shapes"][mode] = shapes
            entry["reductions"][mode] = reductions
        out["tensors"][name] = entry
    step = trial.steps(mode=ModeKeys.TRAIN)[0]
    int8 = trial.tensor("dtype_int8").value(step, mode=ModeKeys.TRAIN)
    out["smdebug_misreads"]["dtype_int8"] = {"smdebug_reads": encode_array(int8)}
    try:
        trial.tensor("dtype_int16").value(step, mode=ModeKeys.TRAIN)
        raise AssertionError("smdebug's reader decoded DT_INT16: update SMDEBUG_MISREADS")
    except KeyError as exc:
        out["smdebug_misreads"]["dtype_int16"] = {"smdebug_raises": f"KeyError: {exc}"}
    return out


def generate(out: Path) -> Path:
    """(Re)write ``out/pytorch_run`` and ``out/expected.json``; return the expected.json path."""
    run_dir = out / "pytorch_run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_run(run_dir)
    expected = read_expected(run_dir)
    path = out / "expected.json"
    path.write_text(json.dumps(expected, indent=1, sort_keys=True, allow_nan=False) + "\n",
                    encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "smdebug_1.0.34",
                        help="folder for pytorch_run/ and expected.json")
    args = parser.parse_args(argv)
    path = generate(args.out)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {path} and {args.out / 'pytorch_run'} ({size} bytes in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
