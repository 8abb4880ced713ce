"""How long ``mltrace diagnose`` takes on a 500-step trial of 200 tensors (target: 10 s).

Writes a trial of ``--steps`` steps with ``--tensors`` tensors shaped like the stability signals
of a transformer (per-head attention logits and entropies, activation statistics, gradient
norms, update ratios, Adam's state, the loss), with a loss spike near the end so that the whole
method runs (anomaly, origin ranking over every tensor, cause), then times ``diagnose`` on it,
fresh ``create_trial`` each run, the median of ``--runs``.

Example:
    .venv/bin/python bench/diagnose_speed.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import protocol
from _support import write_trial


def signals(count: int) -> list[str]:
    """``count`` tensor names of a transformer's stability signals, layer by layer."""
    names = ["LanguageModelLoss_output_0", "grad_norm/GPT"]
    layer = 0
    while len(names) < count:
        h = f"h.{layer}"
        names += [f"attention/{h}.attn/max_logit", f"attention/{h}.attn/entropy",
                  f"activations/{h}.mlp.c_fc/abs_max", f"activations/{h}.mlp.c_fc/l2",
                  f"grad_norm/GPT_{h}.mlp.c_fc.weight", f"updates/GPT_{h}.mlp.c_fc.weight/ratio",
                  f"optimizer_state/GPT_{h}.mlp.c_fc.weight/eps_fraction",
                  f"optimizer_state/GPT_{h}.mlp.c_fc.weight/grad_sq_ratio"]
        layer += 1
    return names[:count]


def write(location: str, steps: int, tensors: int) -> str:
    rng = np.random.default_rng(0)
    names = signals(tensors)
    spike = steps - 20
    data = {}
    for step in range(steps):
        values = {}
        for i, name in enumerate(names):
            base = 1.0 + 0.1 * i
            shape = (4,) if name.startswith("attention/") else ()
            value = base * np.exp(rng.normal(0.0, 0.05, shape))
            if step == spike and (name.startswith("LanguageModelLoss") or name.startswith("grad_norm/")):
                value = value * 20
            values[name] = np.asarray(value, dtype=np.float32)
        data[step] = values
    return write_trial(location, data, {"losses": ["LanguageModelLoss_output_0"]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    from mltrace.diagnosis import diagnose
    from mltrace.trials import create_trial

    protocol.warn_if_busy()
    root = tempfile.mkdtemp(prefix="mltrace-bench-diagnose-")
    try:
        trial_dir = write(os.path.join(root, "trial"), args.steps, args.tensors)
        times = []
        for _ in range(args.runs + 1):
            start = time.perf_counter()
            report = diagnose(create_trial(trial_dir, timeout=0))
            times.append(time.perf_counter() - start)
        times = times[1:]  # the first run warms the page cache and imports
        print(f"diagnose, {args.steps} steps x {args.tensors} tensors: median {statistics.median(times):.2f} s "
              f"(runs {min(times):.2f}..{max(times):.2f}; target <= 10 s); {report.message()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
