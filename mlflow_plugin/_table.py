"""A comparison as text that fits a terminal: ``mltrace compare`` prints it, the CSV keeps every
column at full length.

The table is cut into blocks that each fit ``width`` characters: first the runs (number, name,
steps, status, rules that fired), then the statistics, as many columns per block as fit, each
block led by the run number. A statistic's column is headed by its name when that is short, else
by a number that the legend below the table names in full; run names are shortened in the
middle (``lr-sweep/…=0.1``: the ends tell runs apart).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mltrace.analysis import format_statistic

#: The widest a value column gets (its header is shortened to this, the legend has the rest).
VALUE_WIDTH = 16
ELLIPSIS = "…"


def shorten(text: str, width: int) -> str:
    """``text`` cut in the middle to at most ``width`` characters (the ends are the parts that
    tell tensor names and run names apart)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def _cut_end(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + ELLIPSIS


def _block(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def fired_rules(found: dict[str, dict[str, Any]]) -> str:
    """The rules cell: rules that fired with their first step; clean ones counted."""
    fired = [f"{rule}@{f.get('first_step', '?')}" for rule, f in sorted(found.items())
             if f.get("status") == "IssuesFound"]
    clean = len(found) - len(fired)
    text = ", ".join(fired) or ("-" if not found else "none fired")
    return text + (f" (+{clean} clean)" if fired and clean else "")


def comparison_text(rows: list[dict[str, Any]], value_columns: list[str],
                    findings: dict[str, dict[str, dict[str, Any]]], width: int = 100) -> str:
    """The comparison's terminal text, every line at most ``width`` characters.

    Args:
        rows: one dict per run (keys ``run``, ``steps``, ``status`` and the value columns).
        value_columns: the statistic columns, in order.
        findings: ``{run label: {rule: {status, first_step, ...}}}``.
        width: the terminal's width.
    """
    numbers = [str(i + 1) for i in range(len(rows))]
    num_w = max(1, len(numbers[-1]) if numbers else 1)
    fixed = num_w + 2 + 5 + 2 + 9 + 2  # "#", steps, status and their gaps
    run_w = min(36, max([3] + [len(str(r.get("run", ""))) for r in rows]))
    rules_w = max(12, width - fixed - run_w - 2)
    run_rows = [[n, shorten(str(r.get("run", "")), run_w), format_statistic(r.get("steps")),
                 _cut_end(str(r.get("status") or "-"), 9),
                 _cut_end(fired_rules(findings.get(str(r.get("run")), {})), rules_w)]
                for n, r in zip(numbers, rows)]
    out = [f"runs ({len(rows)})"]
    out += _block(["#", "run", "steps", "status", "rules fired"], run_rows, right={0, 2})
    legend: list[str] = []
    heads = []
    for i, column in enumerate(value_columns):
        name = column.removesuffix(" (last)")
        head = name
        if len(name) > VALUE_WIDTH:  # a number in the header, the name in the legend below
            head = f"[{i + 1}]"
            legend.append(f"  [{i + 1}] {name}")
        heads.append(head)
    cells = [[format_statistic(r.get(c), digits=4) for c in value_columns] for r in rows]
    start = 0
    while start < len(value_columns):
        used, stop = num_w, start
        while stop < len(value_columns):
            col_w = max([len(heads[stop])] + [len(c[stop]) for c in cells])
            if stop > start and used + 2 + col_w > width:
                break
            used += 2 + col_w
            stop += 1
        if start == 0:
            out += ["", "last value of each statistic"]
        else:
            out.append("")
        out += _block(["#", *heads[start:stop]], [[n, *c[start:stop]] for n, c in zip(numbers, cells)],
                      right=set(range(stop - start + 1)))
        start = stop
    if legend:
        out += ["", "columns:"] + [shorten(line, width) for line in legend]
    return "\n".join(out)
