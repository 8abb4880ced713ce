"""``mltrace mcp``: the real server as a subprocess over stdio, driven by the MCP SDK's own client.

One server serves the whole module (started once, ~2 s), over a root that holds a trial of the
PyTorch hook (TRAIN then EVAL, rule results), a synthetic trial with non-finite losses, 300 steps
and flight recorder records, a trial still training, a folder that is no trial, and a symbolic
link to a trial outside the root. Each answer is checked against what the trial holds, read back
with ``create_trial``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import ClientSession, StdioServerParameters, stdio_client

from mltrace import cli
from mltrace.mcp import TrialRoot, list_trials, read_tensor
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial
from tests.support.flight_records import POISONED, write_records
from tests.support.rule_trials import write_trial
from tests.support.tb_trials import GRAD, LOSS, WEIGHT, make_torch_trial

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
TOOLS = {"list_trials", "describe_trial", "read_tensor", "read_rule_results", "diagnose"}
#: the synthetic trial's losses: 300 steps, non-finite at 7, 8 and 9
STEPS = 300
NON_FINITE = {7: math.nan, 8: math.inf, 9: -math.inf}


def _loss(step: int) -> float:
    return NON_FINITE.get(step, 1.0 / (step + 1))


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mcp")
    root = base / "root"
    make_torch_trial(root / "torch")
    write_trial(root / "exp" / "nan_run",
                {s: {"loss": _loss(s), "w": np.array([1.0, 2.0, 3.0]) * s} for s in range(STEPS)},
                collections={"losses": ["^loss$"], "weights": ["^w$"]})
    write_records(str(root / "exp" / "nan_run"))
    write_trial(root / "live", {0: {"loss": 1.0}, 1: {"loss": 0.5}}, end=False)
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a trial")
    write_trial(base / "outside", {0: {"secret": 42.0}})
    os.symlink(base / "outside", root / "link")
    return root


class Client:
    """The SDK's ClientSession, driven from the tests' thread through an anyio portal."""

    def __init__(self, portal: BlockingPortal, session: ClientSession) -> None:
        self.portal = portal
        self.session = session

    def result(self, tool: str, **arguments: Any) -> Any:
        return self.portal.call(self.session.call_tool, tool, arguments)

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """A tool's answer, parsed from its text as a strict JSON parser would (no NaN)."""
        result = self.result(tool, **arguments)
        text = result.content[0].text
        assert not result.is_error, text
        answer = json.loads(text, parse_constant=_refuse)
        assert result.structured_content == answer
        return answer

    def error(self, tool: str, **arguments: Any) -> str:
        result = self.result(tool, **arguments)
        assert result.is_error, result
        return result.content[0].text


def _refuse(constant: str) -> None:
    raise AssertionError(f"the answer holds {constant}, which JSON does not allow")


@pytest.fixture(scope="module")
def server(trials: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mltrace", "mcp", "--root", str(trials)],
        cwd=str(REPO), env={"MLTRACE_TRIAL_WAIT": "2"})
    log = tmp_path_factory.mktemp("mcp-log") / "server.log"
    with open(log, "w") as errlog, start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(stdio_client(params, errlog=errlog)) as streams:
        read, write = streams
        with portal.wrap_async_context_manager(ClientSession(read, write)) as session:
            portal.call(session.initialize)
            yield Client(portal, session)


def test_lists_its_tools_with_descriptions_and_bounds(server):
    tools = {t.name: t for t in server.portal.call(server.session.list_tools).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert len(tool.description or "") > 80, tool.name
    points = tools["read_tensor"].input_schema["properties"]["max_points"]
    assert points["maximum"] == 2000 and points["default"] == 200
    assert tools["read_tensor"].input_schema["required"] == ["trial", "name"]


def test_list_trials_finds_the_trials_under_the_root_only(server, trials):
    answer = server.call("list_trials")
    by_path = {t["trial"]: t for t in answer["trials"]}
    # no folder that is not a trial, no link out of the root
    assert list(by_path) == ["exp/nan_run", "live", "torch"] and answer["count"] == 3
    torch_trial = create_trial(str(trials / "torch"))
    steps = torch_trial.steps()
    assert by_path["torch"] == {
        "trial": "torch", "steps": len(steps), "last_step": steps[-1],
        "workers": torch_trial.workers(), "training_ended": True,
        "modes": {"TRAIN": 6, "EVAL": 2}}
    assert by_path["exp/nan_run"]["steps"] == STEPS
    assert by_path["live"]["training_ended"] is False
    bounded = server.call("list_trials", max_trials=1)
    assert len(bounded["trials"]) == 1 and bounded["more"] == 2 and "max_trials" in bounded["note"]


def test_describe_trial(server, trials):
    answer = server.call("describe_trial", trial="torch")
    trial = create_trial(str(trials / "torch"))
    assert answer["modes"]["TRAIN"] == {"steps": 6, "first": 0, "last": 5}
    assert answer["modes"]["EVAL"] == {"steps": 2, "first": 0, "last": 1}
    assert answer["training_ended"] is True and answer["workers"] == trial.workers()
    for name, coll in answer["collections"].items():
        assert coll["tensors"] == len(trial.tensor_names(collection=name)), name
    assert answer["tensors"] == trial.tensor_names() and answer["tensor_count"] > 3
    assert {"rule": "LossNotDecreasing", "executions": 1, "latest_status": "IssuesFound",
            "fired_steps": 2, "first_step": 3} in answer["rule_results"]
    assert answer["flight_recorder"] == {"first_nonfinite": None, "dumps": [], "dump_count": 0}
    grads = server.call("describe_trial", trial="torch", collection="gradients")
    assert grads["tensors"] == trial.tensor_names(collection="gradients") and GRAD in grads["tensors"]
    found = server.call("describe_trial", trial="torch", pattern="^gradient/", max_tensors=1)
    assert found["tensors"] == [trial.tensor_names(regex="^gradient/")[0]]
    assert found["more"] == found["tensors_matching"] - 1 >= 1 and "max_tensors" in found["note"]


def test_describe_trial_shows_the_flight_recorder(server):
    recorder = server.call("describe_trial", trial="exp/nan_run")["flight_recorder"]
    first = recorder["first_nonfinite"]
    assert (first["tensor"], first["step"], first["worker"]) == (POISONED, 12, "worker_1")
    assert recorder["dump_count"] == 3
    assert [(d["worker"], d["trigger"], d["step"]) for d in recorder["dumps"]] == [
        ("worker_0", "manual", 5), ("worker_1", "nonfinite", 12), ("worker_0", "nonfinite", 13)]
    assert recorder["dumps"][-1]["steps_written"] == 400


def test_read_tensor_gives_the_values_the_trial_holds(server, trials):
    trial = create_trial(str(trials / "torch"))
    train = ModeKeys.TRAIN
    loss = server.call("read_tensor", trial="torch", name=LOSS, mode="train")
    assert loss["steps"] == trial.tensor(LOSS).steps(train) == list(range(6))
    assert loss["global_steps"] == [trial.global_step(train, s) for s in loss["steps"]]
    assert loss["values"] == {"value": [float(trial.tensor(LOSS).value(s, train))
                                        for s in loss["steps"]]}
    assert "note" not in loss and loss["steps_in_range"] == loss["returned"] == 6
    # gradients were saved as reductions only: the stored ones, each step
    grad = server.call("read_tensor", trial="torch", name=GRAD)
    assert set(grad["values"]) == {"min", "max", "mean", "std", "l2", "abs_max"}
    assert grad["values"]["l2"] == [float(trial.tensor(GRAD).reduction_value(s, "l2"))
                                    for s in grad["steps"]]
    # a statistic of a raw tensor is computed from its value
    mean = server.call("read_tensor", trial="torch", name=WEIGHT, statistic="mean",
                       start_step=2, end_step=4)
    assert mean["steps"] == [2, 3, 4]
    assert mean["values"]["mean"] == pytest.approx(
        [float(np.mean(trial.tensor(WEIGHT).value(s))) for s in (2, 3, 4)], rel=1e-6)


def test_read_tensor_is_bounded_and_says_when_it_thins(server):
    answer = server.call("read_tensor", trial="exp/nan_run", name="loss", max_points=50)
    assert answer["steps_in_range"] == STEPS and answer["returned"] == len(answer["steps"]) == 50
    assert answer["steps"][0] == 0 and answer["steps"][-1] == STEPS - 1
    assert "thinned evenly from 300 steps to 50" in answer["note"]
    assert len(server.call("read_tensor", trial="exp/nan_run", name="w")["steps"]) == 200
    assert "max_points" in server.error("read_tensor", trial="exp/nan_run", name="loss",
                                        max_points=5000)


def test_non_finite_values_come_back_as_strings(server):
    answer = server.call("read_tensor", trial="exp/nan_run", name="loss", start_step=6,
                         end_step=10)
    assert answer["values"]["value"] == [pytest.approx(1 / 7), "nan", "inf", "-inf",
                                         pytest.approx(1 / 11)]
    w = server.call("read_tensor", trial="exp/nan_run", name="w", statistic="max", end_step=2)
    assert w["values"] == {"max": [0.0, 3.0, 6.0]}


def test_bad_arguments_are_clear_errors_and_the_server_goes_on(server, trials):
    outside = str(trials.parent / "outside")
    for trial in ("../outside", "exp/../../outside", outside, "link"):  # "link" points out
        message = server.error("read_tensor", trial=trial, name="secret")
        assert f"trial {trial!r} is outside the root" in message and "list_trials" in message
    assert "no trial at 'notes'" in server.error("describe_trial", trial="notes")
    message = server.error("read_tensor", trial="exp/nan_run", name="los")
    assert "tensor 'los' is not in trial 'exp/nan_run'" in message and "'loss'" in message
    assert "statistic 'average'" in server.error("read_tensor", trial="torch", name=LOSS,
                                                statistic="average")
    assert "unknown mode 'TRAINING'" in server.error("read_tensor", trial="torch", name=LOSS,
                                                    mode="TRAINING")
    assert "worker 'worker_9'" in server.error("read_tensor", trial="torch", name=LOSS,
                                               worker="worker_9")
    assert "collection 'nope'" in server.error("describe_trial", trial="torch", collection="nope")
    assert "pattern '('" in server.error("describe_trial", trial="torch", pattern="(")
    assert server.call("list_trials")["count"] == 3


def test_read_rule_results(server, trials):
    answer = server.call("read_rule_results", trial="torch")
    assert answer["count"] == 2
    assert [r["rule"] for r in answer["results"]] == ["LossNotDecreasing", "VanishingGradient"]
    fired = server.call("read_rule_results", trial="torch", rule="LossNotDecreasing")["results"]
    assert len(fired) == 1
    assert {k: fired[0][k] for k in ("status", "fired_steps", "fired_count", "first_step",
                                     "evaluated_steps", "message", "parameters")} == {
        "status": "IssuesFound", "fired_steps": [3, 4], "fired_count": 2, "first_step": 3,
        "evaluated_steps": 6, "message": "loss <b>did not</b> decrease",
        "parameters": {"num_steps": 3, "mode": "TRAIN"}}
    latest = server.call("read_rule_results", trial="torch", max_results=1)
    assert [r["rule"] for r in latest["results"]] == ["VanishingGradient"] and latest["more"] == 1
    none = server.call("read_rule_results", trial="torch", rule="Nope")
    assert none["results"] == [] and "LossNotDecreasing, VanishingGradient" in none["note"]


def test_diagnose(server, trials):
    answer = server.call("diagnose", trial="exp/nan_run")  # strict JSON: its NaN is "nan"
    assert answer["trial"] == "exp/nan_run"
    assert answer["location"] == str(trials / "exp" / "nan_run")
    assert answer["found"] is True and answer["steps"]["count"] == STEPS
    assert (7, "loss") in [(a["step"], a["tensor"]) for a in answer["anomalies"]]
    at_step = server.call("diagnose", trial="exp/nan_run", step=100)
    assert at_step["anomaly"]["step"] == 100
    assert "outside the root" in server.error("diagnose", trial="link")


def test_mltrace_help_and_no_sdk(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0 and "mcp" in capsys.readouterr().out
    assert cli.main(["mcp", "--root", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    for name in [n for n in sys.modules if n == "mcp" or n.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "mltrace.mcp.server", raising=False)
    assert cli.main(["mcp", "--root", str(tmp_path)]) == 2
    assert 'pip install "mltrace[mcp]"' in capsys.readouterr().err


def test_python_m_mltrace_mcp_help():
    done = subprocess.run([sys.executable, "-m", "mltrace", "mcp", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--root" in done.stdout and "mcpServers" in done.stdout


def test_an_s3_root(s3_server, monkeypatch):
    for name, value in (("AWS_ENDPOINT_URL", s3_server.endpoint),
                        ("AWS_ACCESS_KEY_ID", s3_server.access_key),
                        ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    bucket = f"mcp{uuid.uuid4().hex[:10]}"
    s3_server.client().create_bucket(Bucket=bucket)
    for run in ("run1", "team/run2"):
        write_trial(f"s3://{bucket}/jobs/{run}", {s: {"loss": 0.5 * s} for s in range(3)})
    write_trial(f"s3://{bucket}/other/run3", {0: {"loss": 1.0}})
    root = TrialRoot(f"s3://{bucket}/jobs/")
    assert [t["trial"] for t in list_trials(root)["trials"]] == ["run1", "team/run2"]
    for trial in ("team/run2", f"s3://{bucket}/jobs/team/run2"):
        assert read_tensor(root, trial, "loss")["values"] == {"value": [0.0, 0.5, 1.0]}
    for trial, expected in ((f"s3://{bucket}/other/run3", "outside the root"),
                            ("../other/run3", "'..'"), ("/etc", "absolute local path")):
        with pytest.raises(ValueError, match=expected):
            read_tensor(root, trial, "loss")
    with pytest.raises(RuntimeError, match="Listing is not available"):
        list_trials(TrialRoot(f"s3://{bucket}-missing/jobs"))


def test_the_client_configuration_in_readme_starts_this_server(trials):
    """README's ``mcpServers`` entry, as an MCP client would run it (the ``mltrace`` script on
    PATH), with its placeholder root replaced by a real one."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("```json\n", 1)[1].split("```", 1)[0]
    entry = json.loads(block)["mcpServers"]["mltrace"]
    assert entry["command"] == "mltrace" and "/path/to/trials" in entry["args"]
    args = [str(trials) if a == "/path/to/trials" else a for a in entry["args"]]
    script = Path(sys.executable).parent / entry["command"]
    params = StdioServerParameters(command=str(script), args=args, cwd=str(REPO))
    with start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(stdio_client(params)) as (read, write), \
            portal.wrap_async_context_manager(ClientSession(read, write)) as session:
        portal.call(session.initialize)
        assert {t.name for t in portal.call(session.list_tools).tools} == TOOLS
        answer = json.loads(portal.call(session.call_tool, "list_trials", {}).content[0].text)
        assert answer["count"] == 3
