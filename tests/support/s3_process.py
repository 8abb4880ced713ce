"""A SeaweedFS S3 server on free loopback ports, started and stopped by PID, that a test can also
stop and start again on the same ports and data to play an outage. The session-wide server for
ordinary tests (``s3_server`` in tests/conftest.py) is one of these."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys

from tests.support.servers import S3_KEY, S3_SECRET, S3Server, _wait, free_port, stop

BIN = os.path.dirname(sys.executable)
START_ATTEMPTS = 3  # first starts that found a port taken (see RestartableS3.start)


class RestartableS3:
    """``weed mini`` on free ports over one data folder; start() and stop() at will."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(os.path.join(root, "data"), exist_ok=True)
        self.identities = os.path.join(root, "s3.json")
        with open(self.identities, "w") as f:
            json.dump({"identities": [{"name": "admin", "credentials": [
                {"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        self.proc: subprocess.Popen | None = None
        self._served = False  # a start succeeded: the endpoint is known, the ports stay
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.ports = {name: free_port() for name in (
            "s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "filer.port",
            "filer.port.grpc", "volume.port", "volume.port.grpc", "admin.port", "admin.port.grpc")}
        self.server = S3Server(f"http://127.0.0.1:{self.ports['s3.port']}", S3_KEY, S3_SECRET)

    def start(self) -> None:
        """Start ``weed mini`` and wait until it answers S3. A port is picked free, yet another
        process may bind it before weed does ("address already in use": seen once in a CI run):
        until the server has answered once, such a start is stopped and tried again on new
        ports, over an empty data folder. Once it has, the ports are the test's and a restart keeps them."""
        log = os.path.join(self.root, "weed.log")
        for attempt in range(1, START_ATTEMPTS + 1):
            logged = os.path.getsize(log) if os.path.exists(log) else 0
            self.proc = self._launch(log)
            try:
                _wait(self.server.answers, 60, "SeaweedFS", self.proc, log,
                      failed=functools.partial(_port_taken, log, logged))
            except RuntimeError:
                self.stop()
                if self._served or attempt == START_ATTEMPTS or not _port_taken(log, logged):
                    raise
                shutil.rmtree(os.path.join(self.root, "data"))
                os.makedirs(os.path.join(self.root, "data"))
                self._pick_ports()
                continue
            self._served = True
            return

    def _launch(self, log: str) -> subprocess.Popen:
        cmd = [os.path.join(BIN, "weed"), "mini", f"-dir={os.path.join(self.root, 'data')}",
               "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
               f"-s3.config={self.identities}", "-webdav=false", "-admin.ui=false",
               "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"-{k}={v}" for k, v in self.ports.items())]
        with open(log, "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def _port_taken(log: str, since: int) -> bool:
    """Whether the part of ``log`` written from byte ``since`` says a port was taken: found so
    by weed's own check (it then logs it and stays up) or when it binds (it exits)."""
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read()
    return b"Port allocation failed" in text or b"address already in use" in text
