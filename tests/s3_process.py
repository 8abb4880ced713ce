"""A SeaweedFS S3 server that a test can stop and start again on the same ports and data, to
play an outage; the session-wide server for ordinary tests is tests.servers.s3_server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.servers import S3_KEY, S3_SECRET, S3Server, _wait, free_port, stop

BIN = os.path.dirname(sys.executable)


class RestartableS3:
    """``weed mini`` on fixed free ports over one data folder; start() and stop() at will."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(os.path.join(root, "data"), exist_ok=True)
        self.identities = os.path.join(root, "s3.json")
        with open(self.identities, "w") as f:
            json.dump({"identities": [{"name": "admin", "credentials": [
                {"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        self.ports = {name: free_port() for name in (
            "s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "filer.port",
            "filer.port.grpc", "volume.port", "volume.port.grpc", "admin.port", "admin.port.grpc")}
        self.server = S3Server(f"http://127.0.0.1:{self.ports['s3.port']}", S3_KEY, S3_SECRET)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [os.path.join(BIN, "weed"), "mini", f"-dir={os.path.join(self.root, 'data')}",
               "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
               f"-s3.config={self.identities}", "-webdav=false", "-admin.ui=false",
               "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"-{k}={v}" for k, v in self.ports.items())]
        log = os.path.join(self.root, "weed.log")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait(lambda: self.server.client().list_buckets() is not None, 60, "SeaweedFS", self.proc, log)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
