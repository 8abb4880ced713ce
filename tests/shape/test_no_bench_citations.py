"""The library cites no bench document: a benchmark's figures and its write-up live in bench/ and
change with every measurement, so a comment that sends the reader to bench/README.md (or to any
file under bench/) goes stale without anything failing. A comment states what it needs plainly.

This reads every .py file of the library's folders as text (comments and docstrings included).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the library's folders (tb_plugin/ and mlflow_plugin/ install as mltrace_tb and mltrace_mlflow)
LIBRARY = ("mltrace", "tb_plugin", "mlflow_plugin")
#: a path under bench/ ("bench/README.md", "bench/pytorch_overhead.py"), or a bench document by
#: name ("the bench README", "the benchmark document")
CITATION = re.compile(r"(?<![\w./-])bench/|\bbench(?:mark)?s?(?:'s)? (?:README|document|notes?)\b",
                      re.IGNORECASE)


def _sources() -> list[Path]:
    return sorted(p for pkg in LIBRARY for p in (REPO / pkg).rglob("*.py"))


def citations(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of ``text`` that cites a bench document."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if CITATION.search(line)]


def test_the_pattern_finds_the_ways_a_bench_document_is_cited() -> None:
    cited = ["see bench/README.md", "(bench/README.md, 'Quiet steps')", "as bench/pytorch_overhead.py measures",
             "measured in the bench README", "the benchmark document's table", "`bench/results/x.json`"]
    plain = ["a benchmark measures it", "for tests and benchmarks", "workbench/tools", "on the benchmark MLP"]
    assert [c for c in cited if not citations(c)] == []
    assert [p for p in plain if citations(p)] == []


def test_no_library_file_cites_a_bench_document() -> None:
    found = [f"{path.relative_to(REPO)}:{n}: {line}"
             for path in _sources() for n, line in citations(path.read_text(encoding="utf-8"))]
    assert not found, ("library code cites bench documents, which change with every measurement: "
                       f"state what the comment needs instead: {found}")
