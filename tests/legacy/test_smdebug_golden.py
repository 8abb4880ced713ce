"""The committed golden smdebug trial (tests/golden/smdebug_1.0.34) is what its generator makes.

tests/golden/make_smdebug_golden.py is run again into tmp_path with this venv's real smdebug; the
regenerated expected.json must equal the committed one: names, steps, modes, dtypes, shapes,
collections exactly, and float values up to CPU rounding (torch is seeded, so they are the same
numbers; the tolerance only absorbs kernel differences between machines). Index files must be
byte-identical too (offsets depend only on record sizes), collections files equal as JSON (smdebug
orders their keys by set iteration); events files differ only in their wall times, so only their
sizes are compared.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
COMMITTED = GOLDEN_DIR / "smdebug_1.0.34"


def _compare(got, want, where: str = "$") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert sorted(got) == sorted(want), (where, sorted(set(got) ^ set(want)))
        for key in want:
            _compare(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _compare(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-7), (where, got, want)
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


def test_regenerated_golden_equals_committed(tmp_path):
    out = tmp_path / "golden"
    proc = subprocess.run(
        [sys.executable, str(GOLDEN_DIR / "make_smdebug_golden.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    got = json.loads((out / "expected.json").read_text(encoding="utf-8"))
    want = json.loads((COMMITTED / "expected.json").read_text(encoding="utf-8"))
    _compare(got, want)

    new_run, old_run = out / "pytorch_run", COMMITTED / "pytorch_run"
    new_files = sorted(p.relative_to(new_run).as_posix() for p in new_run.rglob("*") if p.is_file())
    old_files = sorted(p.relative_to(old_run).as_posix() for p in old_run.rglob("*") if p.is_file())
    assert new_files == old_files
    for rel in new_files:
        if rel.startswith("events/"):
            assert (new_run / rel).stat().st_size == (old_run / rel).stat().st_size, rel
        elif rel.startswith("collections/"):  # smdebug's key order varies with hash seeds
            _compare(json.loads((new_run / rel).read_text()),
                     json.loads((old_run / rel).read_text()))
        else:
            assert (new_run / rel).read_bytes() == (old_run / rel).read_bytes(), rel
