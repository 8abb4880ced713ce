"""The mltrace tab's frontend data logic (tb_plugin/static/data.js), tested with node's own test
runner (tests/js/*.test.mjs); node is required, not optional: a missing node fails here."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "tb_plugin" / "static"


def test_frontend_data_logic_with_node_test_runner():
    node = shutil.which("node")
    assert node, "node (20 or later) is needed for the frontend's unit tests: apt-get install nodejs"
    files = sorted(str(p) for p in (ROOT / "tests" / "js").glob("*.test.mjs"))
    assert files
    done = subprocess.run([node, "--test", *files], capture_output=True, text=True, cwd=ROOT, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    counts = {k: int(v) for k, v in re.findall(r"^# (pass|fail|skipped|todo|cancelled) (\d+)$", out, re.M)}
    assert counts["pass"] >= 10 and counts["fail"] == counts["skipped"] == counts["todo"] == 0, counts


def test_every_module_parses_and_the_vendored_chart_library_is_recorded():
    node = shutil.which("node")
    assert node
    ours = [p for p in STATIC.glob("*.js") if not p.name.startswith("uPlot")]
    assert {p.name for p in ours} >= {"index.js", "data.js", "dom.js", "overview.js", "detail.js", "rules.js"}
    for path in ours:
        done = subprocess.run([node, "--check", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (path.name, done.stderr)
        source = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                     "https://", "<script"):
            assert sink not in source, (path.name, sink)
        assert "http://" not in source.replace('"http://www.w3.org/2000/svg"', ""), path.name
    # uPlot is served from the plugin itself (no CDN), with its licence kept beside it
    assert "MIT License" in (STATIC / "uPlot.LICENSE").read_text()
    vendored = json.loads((STATIC / "package.json").read_text())["vendored"]["uplot"]
    assert vendored["version"] == "1.6.32" and vendored["license"] == "MIT"
    for name, digest in vendored["sha256"].items():  # the files are the registry's, unchanged
        assert hashlib.sha256((STATIC / name).read_bytes()).hexdigest() == digest, name
    assert (STATIC / "uPlot.esm.js").stat().st_size > 100_000 and (STATIC / "uPlot.min.css").exists()
