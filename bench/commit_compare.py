"""The PyTorch hook's overhead at an earlier commit and now, measured side by side in one run.

Used by ``bench/run_pytorch.py --baseline REV`` (and runnable alone). The earlier commit is checked
out into a temporary git worktree and put first on PYTHONPATH, so the same venv imports that
commit's mltrace; bench/pytorch_overhead.py (today's script, the same model and protocol for both)
runs ``--lib none,mltrace`` for each side in turn, ``--rounds`` times per save interval, each run
with its own no-hook baseline. Reported per side: the median over rounds of the added ms/step
(mltrace - none), and the ratio now / earlier (below 1.0: the hook got faster).

    .venv/bin/python bench/commit_compare.py --baseline 15d503e
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import protocol

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def _overhead(python: str, pythonpath: str | None, interval: int, steps: int, runs: int) -> dict[str, Any]:
    env = dict(os.environ, MLTRACE_LOG_LEVEL="error", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [python, str(BENCH / "pytorch_overhead.py"), "--lib", "none,mltrace", "--interval",
           str(interval), "--steps", str(steps), "--runs", str(runs), "--json"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    line = next(s for s in proc.stdout.splitlines() if s.startswith("{"))
    results = json.loads(line)["results"]
    return {lib: results[lib]["ms_per_step"] for lib in ("none", "mltrace")}


def compare(python: str, ref: str, intervals: tuple[int, ...], steps: int, runs: int,
            rounds: int) -> list[dict[str, Any]]:
    """Rows of (interval, added ms/step at ``ref`` and now, ratio), measured in alternation."""
    worktree = Path(tempfile.mkdtemp(prefix="mltrace-baseline-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), ref], cwd=ROOT, check=True,
                   capture_output=True)
    rows = []
    try:
        for interval in intervals:
            added: dict[str, list[float]] = {"before": [], "now": []}
            for k in range(rounds):
                sides = (("before", str(worktree)), ("now", str(ROOT)))
                # the order alternates: a run after another finds the disk busier with its writes
                for side, path in sides if k % 2 == 0 else sides[::-1]:
                    print(f"[{time.strftime('%H:%M:%S')}] interval {interval} round {k} {side}",
                          file=sys.stderr, flush=True)
                    ms = _overhead(python, path, interval, steps, runs)
                    added[side].append(ms["mltrace"] - ms["none"])
            before, now = protocol.median(added["before"]), protocol.median(added["now"])
            rows.append({"interval": interval, "ref": ref, "added_ms_before": before,
                         "added_ms_now": now, "ratio_now_over_before": now / before if before > 0 else None,
                         "rounds_before": added["before"], "rounds_now": added["now"]})
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False,
                       capture_output=True)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """A table of the rows."""
    lines = ["interval | added ms/step before | added ms/step now | now / before",
             "---------|----------------------|-------------------|-------------"]
    for r in rows:
        ratio = r["ratio_now_over_before"]
        lines.append(f"{r['interval']:>8} | {r['added_ms_before']:>20.4f} | {r['added_ms_now']:>17.4f} | "
                     f"{'n/a' if ratio is None else f'{ratio:.3f}':>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3, help="measured runs per side and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two sides")
    parser.add_argument("--intervals", default="1,100")
    args = parser.parse_args(argv)
    intervals = tuple(int(i) for i in args.intervals.split(","))
    protocol.warn_if_busy()
    rows = compare(args.python, args.baseline, intervals, args.steps, args.runs, args.rounds)
    print(json.dumps(rows))
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
