"""SpikeBench's scoring and its table: which rule fired on which scenario, how many steps after
the fault, how often on healthy training, and whether each fault was caught in time.

Scoring, per rule and run: the *delay* is the steps from the injection to the rule's first
firing at or after it; a firing before the injection, and every firing on a healthy run, is a
*false alarm*, counted per 1,000 healthy steps (the healthy runs' steps and the steps before
each injection). A fault is *caught* when one of its meant-for rules fires within
``SUDDEN_DEADLINE`` steps of a sudden fault, or, for a gradual one, before the step the loss
diverged at (before the run's end where it did not diverge).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from .evaluate import ERROR, MISSING, OK, RuleOutcome
from .scenarios import SUDDEN_DEADLINE, scenario_class
from .train import RunRecord

#: Column headers of the scenarios in the rule table.
SHORT = {"lr_spike": "lr", "shuffled_labels": "shuffle", "repeated_token": "repeat",
         "corrupted_weights": "corrupt", "query_growth": "query", "adam_epsilon": "eps",
         "adam_beta2": "beta2", "fp16_overflow": "fp16", "worker_divergence": "workers"}
#: The loss a run ends at: the mean of its last this many steps' losses (one is too noisy).
FINAL = 50


@dataclass
class Run:
    """A trained run and what each rule found on its trial (by rule name)."""

    record: RunRecord
    outcomes: dict[str, RuleOutcome] = field(default_factory=dict)


def first_firing(fired: Iterable[int], at: int) -> int | None:
    """The first step in ``fired`` at or after ``at``."""
    return min((s for s in fired if s >= at), default=None)


def clean_steps(record: RunRecord) -> int:
    """The steps of a run before its fault (all of them for a healthy run)."""
    return record.steps if record.injected_at is None else record.injected_at


def false_alarms(fired: Iterable[int], record: RunRecord) -> int:
    return sum(1 for s in fired if s < clean_steps(record))


def deadline(record: RunRecord) -> int:
    """The last step a meant-for rule may fire at for the fault to count as caught."""
    assert record.injected_at is not None
    if not scenario_class(record.scenario).gradual:
        return record.injected_at + SUDDEN_DEADLINE
    return (record.steps if record.diverged_at is None else record.diverged_at) - 1


def catch(run: Run) -> tuple[str, int] | None:
    """The meant-for rule that fired first on or after the fault, within the deadline, and its
    delay; None if none did."""
    at = run.record.injected_at
    assert at is not None
    found = []
    for name in scenario_class(run.record.scenario).meant_for:
        outcome = run.outcomes.get(name)
        step = None if outcome is None else first_firing(outcome.fired, at)
        if step is not None and step <= deadline(run.record):
            found.append((step - at, name))
    return (min(found)[1], min(found)[0]) if found else None


def final_loss(record: RunRecord) -> float:
    """The mean loss of the run's last FINAL steps (inf when one of them is not finite)."""
    tail = [v for v in record.losses[-FINAL:] if v is not None]
    return statistics.fmean(tail) if len(tail) == len(record.losses[-FINAL:]) else math.inf


def rule_summary(runs: Sequence[Run], rule: str) -> dict[str, Any]:
    """One rule over every run: status ("missing" where mltrace has no such rule, "error" where
    it failed on every trial), delays per scenario, false alarms per 1,000 healthy steps, and
    the runs it failed on (a rule that compares workers fails on one worker's trial: those runs
    count neither as caught nor as healthy steps)."""
    outcomes = [r.outcomes[rule] for r in runs if rule in r.outcomes]
    statuses = {o.status for o in outcomes}
    status = MISSING if MISSING in statuses else OK if OK in statuses else ERROR
    delays: dict[str, list[int | None]] = {}
    alarms = clean = 0
    for run in runs:
        outcome = run.outcomes.get(rule)
        if outcome is None or outcome.status != OK:
            continue
        record = run.record
        alarms += false_alarms(outcome.fired, record)
        clean += clean_steps(record)
        if record.injected_at is not None:
            step = first_firing(outcome.fired, record.injected_at)
            delays.setdefault(record.scenario, []).append(
                None if step is None else step - record.injected_at)
    errors = [f"{r.record.scenario} seed {r.record.seed}: {r.outcomes[rule].message}"
              for r in runs if rule in r.outcomes and r.outcomes[rule].status == ERROR]
    return {"rule": rule, "status": status, "delays": delays, "false_alarms": alarms,
            "clean_steps": clean,
            "false_alarms_per_1000": 1000 * alarms / clean if clean else None,
            "errors": errors, "seconds": sum(o.seconds for o in outcomes)}


def scenario_verdict(run: Run, healthy: Mapping[tuple[int, int], RunRecord]
                     ) -> dict[str, Any]:
    """One fault run: where it struck, whether a meant-for rule caught it in time, how it ended."""
    record = run.record
    cls = scenario_class(record.scenario)
    caught = catch(run)
    twin = healthy.get((record.workers, record.seed))
    return {"scenario": record.scenario, "seed": record.seed, "injected_at": record.injected_at,
            "layer": record.layer, "what": cls(None, None, record.seed).describe(),
            "meant_for": list(cls.meant_for), "gradual": cls.gradual,
            "deadline": deadline(record), "caught_by": caught and caught[0],
            "delay": caught and caught[1], "diverged_at": record.diverged_at,
            "final_loss": final_loss(record),
            "healthy_final_loss": None if twin is None else final_loss(twin),
            "wall_s": record.wall_s}


def summarize(runs: Sequence[Run], rules: Sequence[str]) -> dict[str, Any]:
    """Every rule's summary, every fault run's verdict, and the healthy runs' loss curves."""
    healthy = [r.record for r in runs if r.record.injected_at is None]
    twins = {(r.workers, r.seed): r for r in healthy}
    faults = [r for r in runs if r.record.injected_at is not None]
    return {"rules": [rule_summary(runs, rule) for rule in rules],
            "scenarios": [scenario_verdict(r, twins) for r in faults],
            "healthy": [{"scenario": r.scenario, "seed": r.seed, "loss_0": r.losses[0], "loss_100": _at(r.losses, 100),
                         "loss_last": r.losses[-1], "final_loss": final_loss(r),
                         "wall_s": r.wall_s} for r in healthy]}


def _at(values: Sequence[float | None], i: int) -> float | None:
    return values[i] if i < len(values) else None


def _cell(delays: list[int | None] | None, meant: bool) -> str:
    if not delays:
        return "n/a"
    hit = [d for d in delays if d is not None]
    mark = "*" if meant else ""
    if len(delays) == 1:
        return f"+{hit[0]}{mark}" if hit else f".{mark}"
    text = f"{len(hit)}/{len(delays)}"
    if hit:
        text += f" +{statistics.median(hit):g}"
    return text + mark


def _fmt(value: float | None, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    return format(value, spec) if math.isfinite(value) else "non-finite"


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def print_table(summary: Mapping[str, Any], scenarios: Sequence[str], out: TextIO) -> None:
    """The rule table, the per-scenario verdicts and the healthy runs, as plain text."""
    columns = list(dict.fromkeys(s for s in scenarios if scenario_class(s).injects))
    width = max(len(r["rule"]) for r in summary["rules"]) + 2 if summary["rules"] else 6
    cells = {s: max(8, len(SHORT.get(s, s)) + 2) for s in columns}
    if summary["rules"]:
        _print_rules(summary["rules"], columns, width, cells, out)
        print(file=out)
    _print_verdicts(summary["scenarios"], bool(summary["rules"]), out)
    print(file=out)
    _print_healthy(summary["healthy"], out)


def _print_rules(rules: Sequence[Mapping[str, Any]], columns: Sequence[str], width: int,
                 cells: Mapping[str, int], out: TextIO) -> None:
    print("Delay in steps from each fault to a rule's first firing at or after it ('.': did "
          "not fire; '*': the rule is meant for it; 'k/n +d': fired on k of n runs, median "
          "delay d); false alarms per 1,000 healthy steps.", file=out)
    head = "rule".ljust(width) + "".join(SHORT.get(s, s).ljust(cells[s]) for s in columns)
    print(head + "false alarms", file=out)
    notes = []
    for rule in rules:
        line = rule["rule"].ljust(width)
        if rule["status"] != OK:
            print(line + rule["status"], file=out)
            if rule["errors"]:
                notes.append(f"{rule['rule']} failed on every trial, e.g. {rule['errors'][0]}")
            continue
        for s in columns:
            meant = rule["rule"] in scenario_class(s).meant_for
            line += _cell(rule["delays"].get(s), meant).ljust(cells[s])
        rate = rule["false_alarms_per_1000"]
        print(line + f"{_fmt(rate, '.1f')} ({rule['false_alarms']} in {rule['clean_steps']})",
              file=out)
        if rule["errors"]:
            notes.append(f"{rule['rule']} did not run on {len(rule['errors'])} trial(s), e.g. "
                         f"{rule['errors'][0]}")
    for note in notes:
        print(_short("  " + note), file=out)


def _print_verdicts(verdicts: Sequence[Mapping[str, Any]], judged: bool, out: TextIO) -> None:
    print(f"{'scenario':<19}{'seed':>4} {'at':>4} {'block':>5}  {'caught':<36}"
          f"{'diverged':>8}  {'final loss (healthy)':<24}{'wall s':>7}", file=out)
    for v in verdicts:
        when = (f"before step {v['deadline'] + 1}" if v["gradual"]
                else f"within {SUDDEN_DEADLINE} steps")
        caught = (f"yes: {v['caught_by']} +{v['delay']}" if v["caught_by"]
                  else f"NO ({when})" if judged else "- (no rules run)")
        final = f"{_fmt(v['final_loss'])} ({_fmt(v['healthy_final_loss'])})"
        print(f"{v['scenario']:<19}{v['seed']:>4} {v['injected_at']:>4} "
              f"{_fmt(v['layer'], 'd'):>5}  {caught:<36}{_fmt(v['diverged_at'], 'd'):>8}  "
              f"{final:<24}{v['wall_s']:>7.1f}", file=out)
        print(f"{'':<21}{v['what']}; meant for {', '.join(v['meant_for'])} "
              f"({'gradual: before the loss diverges' if v['gradual'] else 'sudden: ' + when})",
              file=out)


def _print_healthy(healthy: Sequence[Mapping[str, Any]], out: TextIO) -> None:
    if not healthy:
        return
    print(f"healthy runs: loss at steps 0, 100 and the last; mean loss of the last {FINAL} "
          "steps; wall s", file=out)
    for h in healthy:
        print(f"  {h['scenario']} seed {h['seed']}: {_fmt(h['loss_0'])}, {_fmt(h['loss_100'])}, "
              f"{_fmt(h['loss_last'])}; {_fmt(h['final_loss'])}; {h['wall_s']:.1f}", file=out)
