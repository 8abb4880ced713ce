"""Rule evaluation throughput: mltrace's VanishingGradient and ExplodingTensor vs the same rule
logic on real smdebug 1.0.34's Trial, over one 1000-step trial, side by side in one process.

Run it with the legacy venv, which has both libraries (the trial is written once by mltrace's
PyTorch hook; both readers read it):

    .venv-legacy/bin/python bench/rules_throughput.py [--steps 1000] [--runs 5]

smdebug's built-in rules were never published, so its side is the documented condition written
against smdebug's Trial API (as AWS documents the rules): VanishingGradient = mean(|g|) of each
gradient below 1e-7 (from the stored abs_mean reduction); ExplodingTensor = any NaN/Inf in the
raw value of each tensor of the chosen collections. Protocol (bench/protocol.py): one warm-up,
the median of ``--runs``; each library's runs in a row, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch

import protocol

os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("SMDEBUG_TRAINING_END_DELAY_REFRESH", "0")


def write_trial(path: str, steps: int) -> None:
    import mltrace.pytorch as smd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    hook = smd.Hook(out_dir=path, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"])
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        abs_reductions=["mean"], save_raw_tensor=True)
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    hook.close()


def mltrace_rules(path: str, name: str, params: dict | None = None) -> int:
    """The built-in rule ``name`` over every step of a fresh trial (ExplodingTensor on weights and
    gradients unless ``params`` say otherwise); the steps it evaluated."""
    from mltrace.exceptions import NoMoreData
    from mltrace.rules import invoke_rule
    from mltrace.rules.builtin import rule_class
    from mltrace.trials import create_trial

    if params is None:
        params = {"collection_names": "weights,gradients"} if name == "ExplodingTensor" else {}
    rule = rule_class(name)(create_trial(path), **params)
    try:
        result = invoke_rule(rule)
    except NoMoreData as exc:
        result = exc.rule_result
    return result.evaluated_steps


def smdebug_rules(path: str, name: str) -> int:
    from smdebug.exceptions import NoMoreData, RuleEvaluationConditionMet
    from smdebug.rules.rule import Rule
    from smdebug.rules.rule_invoker import invoke_rule
    from smdebug.trials import create_trial

    class Vanishing(Rule):
        def __init__(self, trial):
            super().__init__(trial, action_str="")
            self.evaluated = 0

        def invoke_at_step(self, step):
            self.evaluated += 1
            for tname in self.base_trial.tensor_names(collection="gradients"):
                if self.base_trial.tensor(tname).reduction_value(step, "mean", abs=True) < 1e-7:
                    return True
            return False

    class Exploding(Rule):
        def __init__(self, trial):
            super().__init__(trial, action_str="")
            self.evaluated = 0

        def invoke_at_step(self, step):
            self.evaluated += 1
            for coll in ("weights", "gradients"):
                for tname in self.base_trial.tensor_names(collection=coll):
                    value = self.base_trial.tensor(tname).value(step)
                    if not np.isfinite(value).all():
                        return True
            return False

    rule = (Vanishing if name == "VanishingGradient" else Exploding)(create_trial(path))
    try:
        invoke_rule(rule, raise_eval_cond=False)
    except (NoMoreData, RuleEvaluationConditionMet):
        pass
    return rule.evaluated


def measure(fn, path: str, name: str, runs: int) -> tuple[float, int]:
    """(median seconds, steps evaluated) of ``runs`` runs of ``fn`` after one warm-up."""
    def run() -> tuple[float, int]:
        start = time.perf_counter()
        steps = fn(path, name)
        return time.perf_counter() - start, steps

    measured = protocol.interleaved({name: run}, runs)
    return protocol.pick(measured, 0)[name].median, measured[name].runs[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    machine = protocol.machine()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trial")
        write_trial(path, args.steps)
        rows = []
        for name in ("VanishingGradient", "ExplodingTensor"):
            m_s, m_n = measure(mltrace_rules, path, name, args.runs)
            s_s, s_n = measure(smdebug_rules, path, name, args.runs)
            rows.append({"rule": name, "mltrace_steps_per_s": m_n / m_s, "smdebug_steps_per_s": s_n / s_s,
                         "steps": [m_n, s_n], "speedup": (m_n / m_s) / (s_n / s_s)})
    print(f"Rule throughput over a {args.steps}-step trial (median of {args.runs}, one process; "
          f"commit {machine['commit']}, load {protocol.load_average():.2f})")
    print(f"{'rule':<20}{'mltrace steps/s':>17}{'smdebug steps/s':>17}{'speed-up':>10}")
    for r in rows:
        print(f"{r['rule']:<20}{r['mltrace_steps_per_s']:>17.0f}{r['smdebug_steps_per_s']:>17.0f}"
              f"{r['speedup']:>9.1f}x")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/rules.json", "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
