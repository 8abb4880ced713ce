"""The ``mltrace`` command as a shell user meets it: a path that does not exist fails at once
(waiting only with --wait), output piped into a reader that stops early ends quietly, and
``mltrace tensorboard`` stopped by a signal leaves no process and no busy port behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import psutil
import pytest

from tests.support.rule_trials import write_trial
from tests.support.servers import free_port
from tests.support.tb_trials import make_torch_trial

BIN = os.path.dirname(sys.executable)
MLTRACE = os.path.join(BIN, "mltrace")


def _run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([MLTRACE, *argv], capture_output=True, text=True, timeout=120, **kwargs)


def test_info_on_a_missing_path_fails_at_once(tmp_path):
    started = time.monotonic()
    out = _run("info", str(tmp_path / "nope"))
    took = time.monotonic() - started
    assert out.returncode == 2
    assert "does not exist" in out.stderr and "--wait SECONDS" in out.stderr
    assert str(tmp_path / "nope") in out.stderr
    assert "Traceback" not in out.stderr
    assert took < 8  # the interpreter's start-up, not the 10 s wait it used to be


def test_info_waits_only_when_asked(tmp_path):
    started = time.monotonic()
    out = _run("info", str(tmp_path / "later"), "--wait", "1.5")
    assert out.returncode == 2 and "no trial data" in out.stderr
    assert time.monotonic() - started >= 1.5


def test_rule_cli_on_a_missing_path_fails_at_once(tmp_path):
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "mltrace.rules.rule_invoker", "--trial-dir",
                          str(tmp_path / "nope"), "--rule-name", "VanishingGradient"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "does not exist" in out.stderr and "--wait" in out.stderr
    assert time.monotonic() - started < 8


@pytest.fixture(scope="module")
def wide_trial(tmp_path_factory) -> str:
    """A trial whose ``mltrace info`` is far longer than a pipe's buffer (64 KiB)."""
    path = tmp_path_factory.mktemp("wide") / "run"
    names = {f"layer{i:04d}/a_rather_long_tensor_name_for_padding.weight": np.ones(2)
             for i in range(1500)}
    return write_trial(path, {0: names, 1: names})


def test_output_into_a_reader_that_stops_ends_quietly(wide_trial):
    out = subprocess.run(["bash", "-c", f"{MLTRACE} info {wide_trial} | head -n 3"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[0] == f"trial {wide_trial}"
    assert out.stderr == ""


def test_output_into_a_closed_pipe_exits_like_sigpipe(wide_trial):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        proc = subprocess.run([MLTRACE, "info", wide_trial], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_tensorboard_stops_with_its_command(tmp_path, sig):
    trial = make_torch_trial(tmp_path / "run", train_steps=3, eval_steps=1)
    port = free_port()
    log = open(tmp_path / "tb.log", "wb")
    proc = subprocess.Popen([MLTRACE, "tensorboard", trial, "--port", str(port),
                             "--host", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _serving(f"http://127.0.0.1:{port}/data/runs"):
            assert proc.poll() is None, (tmp_path / "tb.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "TensorBoard did not start"
            time.sleep(0.5)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "mltrace tensorboard runs TensorBoard as a child"
        proc.send_signal(sig)  # to the command only, as `kill PID` or Ctrl-C in a shell
        code = proc.wait(60)  # within STOP_GRACE, or SIGTERM 10 s later (a loaded machine)
        assert code in (0, 128 + sig, 128 + signal.SIGTERM)
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"left behind: {alive}"
        assert _port_free(port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


IGNORES_SIGINT = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "print('ready', flush=True); time.sleep(120)")


@pytest.mark.slow
def test_a_child_that_ignores_the_signal_gets_sigterm_after_the_grace(tmp_path):
    """run_child passes SIGINT on; a child still running STOP_GRACE seconds later gets SIGTERM
    (TensorBoard busy loading can miss a SIGINT): the command never hangs on Ctrl-C."""
    script = ("import os, sys; from mltrace_tb import launch; launch.STOP_GRACE = 2.0; "
              f"sys.exit(launch.run_child([sys.executable, '-c', {IGNORES_SIGINT!r}], dict(os.environ)))")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        child = psutil.Process(proc.pid).children()[0]
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 128 + signal.SIGTERM
        assert 1.5 < time.monotonic() - started < 20
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        assert "did not stop within 2 s of signal 2; sending SIGTERM" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
