"""S3 storage against a real S3 server (SeaweedFS on 127.0.0.1): hooks, readers, outages."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import mltrace.pytorch as smd
from mltrace.exceptions import MltraceRuntimeError
from mltrace.trials import create_trial
from tests.support.s3_process import RestartableS3
from tests.support.torch_training import make_model, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _aws_env(monkeypatch, server, key=None, secret=None):
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key or server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret or server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def bucket(s3_server, monkeypatch):
    name = f"t{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    _aws_env(monkeypatch, s3_server)
    return name


def test_pytorch_run_to_s3_reads_back(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("MLTRACE_SPILL_DIR", str(tmp_path / "spill"))
    uri = f"s3://{bucket}/jobs/run1"
    model = make_model()
    hook = smd.Hook(out_dir=uri, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    hook.register_module(model)
    captured = train(model, hook, 4)
    hook.close()
    trial = create_trial(uri)
    assert trial.steps() == [0, 1, 2, 3] and trial.loaded_all_steps
    values = trial.tensor("Sequential_0.weight").values()
    for step in range(4):
        assert np.array_equal(values[step], captured.values["Sequential_0.weight"][step])
        assert np.array_equal(trial.tensor("gradient/Sequential_0.weight").value(step),
                              captured.values["gradient/Sequential_0.weight"][step])
    assert not os.listdir(tmp_path / "spill") if (tmp_path / "spill").exists() else True


def test_wrong_credentials_give_a_clear_error(bucket, s3_server, monkeypatch):
    _aws_env(monkeypatch, s3_server, secret="not-the-secret")
    with pytest.raises(MltraceRuntimeError, match="rejected the credentials"):
        smd.Hook(out_dir=f"s3://{bucket}/x")
    with pytest.raises(MltraceRuntimeError, match="rejected the credentials"):
        create_trial(f"s3://{bucket}/x", timeout=1)


def test_unreachable_endpoint_gives_a_clear_error(monkeypatch):
    from tests.support.servers import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(MltraceRuntimeError, match="unreachable"):
        create_trial("s3://nobucket/x", timeout=1)


LIVE = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {repo!r})
    import mltrace.pytorch as smd
    from tests.support.torch_training import make_model
    model = make_model()
    hook = smd.Hook(out_dir={uri!r}, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.register_module(model)
    for step in range({steps}):
        model(torch.ones(1, 4))
        time.sleep({pause})
    hook.close()
""")


def test_live_reader_on_s3_beside_training(bucket):
    uri = f"s3://{bucket}/live"
    proc = subprocess.Popen([sys.executable, "-c", LIVE.format(repo=REPO, uri=uri, steps=10, pause=0.3)])
    try:
        trial = create_trial(uri, timeout=60)
        seen = []
        deadline = time.monotonic() + 90
        while not trial.loaded_all_steps and time.monotonic() < deadline:
            seen.append(len(trial.steps()))
            time.sleep(0.2)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert trial.loaded_all_steps and trial.steps() == list(range(10))
    assert len(set(seen)) > 2, seen
    assert trial.tensor("Sequential_0.weight").value(9).shape == (8, 4)


def test_a_server_whose_port_was_taken_before_it_bound_starts_on_new_ports(tmp_path):
    """A port picked free and taken by another process before weed binds it (a CI run hit
    this once) costs a retry, not the tests that need the server; a restart keeps its ports."""
    server = RestartableS3(str(tmp_path / "weed"))
    taken = server.ports["s3.port"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            server.start()
            assert server.ports["s3.port"] != taken
            assert server.server.endpoint.endswith(f":{server.ports['s3.port']}")
            server.server.client().create_bucket(Bucket="moved")
            ports = dict(server.ports)
            server.stop()
            server.start()  # the endpoint is known now: same ports, same data
            assert server.ports == ports
            assert [b["Name"] for b in server.server.client().list_buckets()["Buckets"]] == ["moved"]
        finally:
            server.stop()
    log = (tmp_path / "weed" / "weed.log").read_text(errors="replace")
    assert f"port {taken} " in log  # the first start found it taken


@pytest.fixture
def outage_server(tmp_path, monkeypatch):
    server = RestartableS3(str(tmp_path / "weed"))
    server.start()
    _aws_env(monkeypatch, server.server)
    monkeypatch.setenv("MLTRACE_SPILL_DIR", str(tmp_path / "spill"))
    server.server.client().create_bucket(Bucket="outage")
    yield server
    server.stop()


def _train_through(hook, model, steps, start=0):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(start, start + steps):
        opt.zero_grad()
        model(torch.ones(8, 4)).pow(2).mean().backward()
        opt.step()


def test_s3_outage_mid_run_loses_no_step(outage_server, caplog):
    uri = "s3://outage/run"
    model = make_model()
    hook = smd.Hook(out_dir=uri, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    hook.register_module(model)
    _train_through(hook, model, 5)
    outage_server.stop()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        _train_through(hook, model, 20, start=5)  # training goes on while S3 is down
        assert time.monotonic() - started < 60  # never stuck on the network
        outage_server.start()
        hook.close()
    assert any("answers again" in r.getMessage() for r in caplog.records)
    trial = create_trial(uri)
    assert trial.steps() == list(range(25)) and trial.loaded_all_steps
    for step in trial.steps():
        assert trial.tensor("gradient/Sequential_0.weight").value(step).shape == (8, 4)


@pytest.mark.slow
def test_s3_that_never_comes_back_leaves_files_and_the_command(outage_server, caplog, tmp_path):
    uri = "s3://outage/gone"
    model = make_model()
    hook = smd.Hook(out_dir=uri, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.register_module(model)
    _train_through(hook, model, 3)
    hook.writer.close_timeout = 3.0
    hook.writer.retry_interval = 0.5
    outage_server.stop()
    _train_through(hook, model, 4, start=3)
    with caplog.at_level(logging.ERROR, logger="mltrace"):
        hook.close()
    message = next(r.getMessage() for r in caplog.records if "upload-spill" in r.getMessage())
    folder = message.rsplit("mltrace upload-spill ", 1)[1].strip()
    assert os.path.isdir(folder) and str(tmp_path / "spill") in folder
    outage_server.start()
    out = subprocess.run([sys.executable, "-m", "mltrace.cli", "upload-spill", folder],
                         capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    trial = create_trial(uri)
    assert trial.steps() == list(range(7)) and trial.loaded_all_steps
