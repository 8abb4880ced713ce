"""SpikeBench: which stability rule catches which transformer-training failure, and how soon.

Trains a small nanoGPT-style model (bench/nanogpt.py) char-level on a seeded synthetic language
(spikebench/corpus.py) once per scenario and fault seed, each run with one failure injected at a
seeded step of the middle of the run (spikebench/scenarios.py), and ``--seeds`` healthy runs;
every run saves the ``stability`` collection every step with mltrace's PyTorch hook. Then runs
every stability rule over every trial, offline, and prints a table: per rule, the delay from
each fault to its first firing and its false alarms per 1,000 healthy steps; per fault, whether
a rule meant for it caught it in time (spikebench/report.py says how each figure is scored).

Trainings run ``--jobs`` at a time, each in a fresh process with one torch thread;
worker_divergence's two DistributedDataParallel workers run after the others, alone. Trials and
each run's ``run.json`` stay under ``--out``; ``--reuse`` runs the rules again over trials
trained before with the same steps and collections. The report goes to
bench/results/spikebench.json (``--report``).

Examples:
    .venv/bin/python bench/spikebench/run.py
    .venv/bin/python bench/spikebench/run.py --scenarios lr_spike,query_growth --seeds 2
    .venv/bin/python bench/spikebench/run.py --reuse --json
    .venv/bin/python bench/spikebench/run.py --collections losses  # the harness, no signals
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from spikebench import evaluate, report, train
from spikebench.scenarios import HEALTHY, HEALTHY_WORKERS, SCENARIOS, scenario_class

import protocol

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(BENCH, "results")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS),
                   help="faults to inject (names or comma-separated; default: all): "
                        + ", ".join(SCENARIOS))
    p.add_argument("--seeds", type=int, default=5, help="healthy runs (seeds S..S+N-1)")
    p.add_argument("--fault-seeds", type=int, default=1, help="runs per fault (seeds S..S+N-1)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="S, the first seed of every kind of run: runs held out from the ones the "
                        "rules' defaults were set on start at a later seed")
    p.add_argument("--healthy-workers", type=int, default=1,
                   help="healthy runs of two DDP workers (seeds 0..N-1; where a fault needs "
                        "workers): the worker rule's false alarms")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--out", default=os.path.join(RESULTS, "spikebench"),
                   help="where the runs' trials go")
    p.add_argument("--jobs", type=int, default=2, help="trainings and evaluations at a time")
    p.add_argument("--collections", default="stability",
                   help="the hook's collections, comma-separated ('' for no hook)")
    p.add_argument("--clip", type=float, default=train.CLIP,
                   help="clip gradients to this norm (0: no clipping)")
    p.add_argument("--rules", default=",".join(evaluate.RULES), help="rules to run")
    p.add_argument("--param", action="append", default=[], metavar="RULE:NAME=VALUE",
                   help="a rule parameter other than its default (repeatable), e.g. "
                        "AdamStaleSecondMoment:warn_stale=true")
    p.add_argument("--reuse", action="store_true",
                   help="keep runs already trained under --out with these settings")
    p.add_argument("--json", action="store_true", help="print the JSON report instead")
    p.add_argument("--report", default=os.path.join(RESULTS, "spikebench.json"),
                   help="where the JSON report goes")
    return p


def _names(values: Sequence[str]) -> list[str]:
    return [n for v in values for n in v.split(",") if n]


def _specs(args: argparse.Namespace) -> list[train.RunSpec]:
    collections = tuple(_names([args.collections]))
    first = args.first_seed
    runs = [(s, seed) for s in _names(args.scenarios) for seed in range(first, first + args.fault_seeds)]
    runs += [(HEALTHY, seed) for seed in range(first, first + args.seeds)]
    if any(scenario_class(name).workers > 1 for name, _ in runs):
        runs += [(HEALTHY_WORKERS, seed) for seed in range(first, first + args.healthy_workers)]
    return [train.RunSpec(name, seed, args.steps, os.path.join(args.out, f"{name}-seed{seed}"),
                          collections, args.clip) for name, seed in runs]


def _reusable(spec: train.RunSpec) -> train.RunRecord | None:
    try:
        with open(os.path.join(spec.run_dir, "run.json")) as f:
            record = train.RunRecord(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None
    if (record.steps, tuple(record.collections), record.clip) == (
            spec.steps, spec.collections, spec.clip):
        return record
    return None


def _pool(jobs: int) -> ProcessPoolExecutor:
    """Fresh spawned processes, one task each: a run's hook and torch state start clean."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               max_tasks_per_child=1)


def _map(work: Callable[..., Any], items: Sequence[Any], jobs: int,
         done: Callable[[Any, Any], None]) -> list[Any]:
    if not items:
        return []
    with _pool(min(jobs, len(items))) as pool:
        futures = [pool.submit(work, item) for item in items]
        results = []
        for item, future in zip(items, futures):
            results.append(future.result())
            done(item, results[-1])
    return results


def _train_all(specs: list[train.RunSpec], jobs: int, reuse: bool) -> list[train.RunRecord]:
    records: dict[train.RunSpec, train.RunRecord] = {}
    if reuse:
        records = {s: r for s in specs if (r := _reusable(s)) is not None}
    todo = [s for s in specs if s not in records]

    def done(spec: train.RunSpec, record: train.RunRecord) -> None:
        records[spec] = record
        print(f"trained {spec.scenario} seed {spec.seed}: {record.wall_s:.1f} s",
              file=sys.stderr)

    _map(train.run, [s for s in todo if s.workers == 1], jobs, done)
    _map(train.run, [s for s in todo if s.workers > 1], 1, done)  # the workers use every core
    return [records[s] for s in specs]


def _rule_params(given: Sequence[str]) -> dict[str, dict[str, str]]:
    params: dict[str, dict[str, str]] = {}
    for item in given:
        rule, _, assignment = item.partition(":")
        name, eq, value = assignment.partition("=")
        if not (rule and name and eq):
            raise SystemExit(f"--param {item!r}: write RULE:NAME=VALUE")
        params.setdefault(rule, {})[name] = value
    return params


def _evaluate_all(records: list[train.RunRecord], rules: tuple[str, ...],
                  params: dict[str, dict[str, str]], jobs: int) -> list[report.Run]:
    def done(record: train.RunRecord, outcomes: list[evaluate.RuleOutcome]) -> None:
        print(f"ran the rules on {record.scenario} seed {record.seed}: "
              f"{sum(o.seconds for o in outcomes):.1f} s", file=sys.stderr)

    work = functools.partial(evaluate.evaluate_run, rules=rules, params=params)
    found = _map(work, records, jobs, done)
    return [report.Run(r, {o.rule: o for o in outcomes}) for r, outcomes in zip(records, found)]


def _jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as None (JSON has no NaN or infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = sorted(set(_names(args.scenarios)) - set(SCENARIOS))
    if unknown:
        print(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    protocol.warn_if_busy()
    machine = protocol.machine()
    specs = _specs(args)
    start = time.perf_counter()
    records = _train_all(specs, args.jobs, args.reuse)
    rules = tuple(_names([args.rules])) if specs[0].collections else ()
    params = _rule_params(args.param)
    runs = (_evaluate_all(records, rules, params, args.jobs) if rules
            else [report.Run(r) for r in records])
    summary = report.summarize(runs, rules)
    result = {"machine": machine, "config": {**vars(args), "model": repr(train.CONFIG)},
              "seconds": time.perf_counter() - start, **summary,
              "runs": [{**r.record.as_dict(), "outcomes": [o.as_dict() for o in r.outcomes.values()]}
                       for r in runs]}
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(args.report, "w") as f:
        json.dump(_jsonable(result), f, indent=1)
    if args.json:
        json.dump(_jsonable(result), sys.stdout, indent=1)
        print()
        return 0
    print(f"SpikeBench: {args.steps} steps, {args.fault_seeds} run(s) per fault, {args.seeds} "
          f"healthy; {train.CONFIG}; commit {machine['commit']}, load "
          f"{machine['load_per_core']}/core")
    report.print_table(summary, [s.scenario for s in specs], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
