"""The team set-up's servers for tests, on 127.0.0.1 and stopped by PID: PostgreSQL (Debian's
package), ``mlflow server`` on it with artifacts on SeaweedFS, and a two-node Ray cluster.

Each is a context manager (``running_postgres``, ``running_mlflow_pg``, ``running_ray_cluster``);
the session-scoped fixtures over them (postgres, mlflow_pg, ray_cluster, on the ``s3_server`` of
tests/conftest.py) are in tests/watch/test_team_setup.py, their one user.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user of the
Debian package (created here as a system user if absent) through ``setpriv``, which execs in
place: the PID we hold is the postmaster's. Its data folder is a fresh ``initdb`` in a temporary
folder that user owns; password (SCRAM) authentication on 127.0.0.1 only, no Unix socket outside
that folder. A test may stop and start it (``PostgresServer.stop/start``) to play an outage.

Ray: ``ray start --head --block`` on 127.0.0.2 and one ``ray start --block`` worker node on
127.0.0.3 (all of 127/8 is loopback; Ray replaces 127.0.0.1 itself with the machine's address,
and refuses worker nodes when told not to), each 1 CPU, a small object store, no dashboard, each
in its own process group killed at the end. Ray 2.60 still listens on every interface; the
addresses it hands out are loopback ones.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import (
    S3_KEY,
    S3_SECRET,
    S3Server,
    _tail,
    _wait,
    free_port,
    running_mlflow_server,
    stop,
)

BIN = os.path.dirname(sys.executable)
PG_USER, PG_PASSWORD, PG_DB = "mltrace", "mltrace-test-pw", "mlflow"


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))),
                                       None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is missing: bash scripts/setup.sh installs "
                           "Debian's postgresql package (apt-get install postgresql)")
    return found


def _run_as() -> tuple[list[str], str | None]:
    """(command prefix, user) for running PostgreSQL: setpriv to ``postgres`` as root."""
    if os.geteuid() != 0:
        return [], None
    user = "postgres"
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        user], check=True, stdin=subprocess.DEVNULL)
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"], user


class PostgresServer:
    """A PostgreSQL server in a fresh data folder, on a free loopback port."""

    def __init__(self) -> None:
        self.prefix, self.user = _run_as()
        self.root = tempfile.mkdtemp(prefix="mltrace-pg-")
        self.data = os.path.join(self.root, "data")
        self.port = free_port()
        self.log = os.path.join(self.root, "postgres.log")
        self.proc: subprocess.Popen | None = None
        pwfile = os.path.join(self.root, "pw")
        with open(pwfile, "w") as f:
            f.write(PG_PASSWORD)
        if self.user:
            info = pwd.getpwnam(self.user)
            for path in (self.root, pwfile):
                os.chown(path, info.pw_uid, info.pw_gid)
        subprocess.run([*self.prefix, _pg_bin("initdb"), "-D", self.data, "-U", PG_USER,
                        f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8",
                        "--locale=C", "--no-instructions"], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.remove(pwfile)

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the MLflow database (psycopg2: SQLAlchemy 2.1 would pick psycopg 3)."""
        return f"postgresql+psycopg2://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.port}/{PG_DB}"

    def start(self) -> None:
        cmd = [*self.prefix, _pg_bin("postgres"), "-D", self.data, "-h", "127.0.0.1",
               "-p", str(self.port), "-k", self.root, "-c", "fsync=off",
               "-c", "max_connections=50", "-c", "shared_buffers=32MB"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        _wait(self._answers, 60, "PostgreSQL", self.proc, self.log)

    def _answers(self) -> bool:
        import psycopg2

        psycopg2.connect(host="127.0.0.1", port=self.port, user=PG_USER, password=PG_PASSWORD,
                         dbname="postgres", connect_timeout=2).close()
        return True

    def create_database(self, name: str) -> None:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=PG_USER,
                                password=PG_PASSWORD, dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, by PID), then SIGKILL."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                stop(self.proc)
        self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A running PostgreSQL server with an empty ``mlflow`` database."""
    server = PostgresServer()
    try:
        server.start()
        server.create_database(PG_DB)
        yield server
    finally:
        server.remove()


@dataclass
class MlflowPgServer:
    uri: str
    bucket: str
    s3: S3Server
    postgres: PostgresServer
    log: str


@contextmanager
def running_mlflow_pg(postgres: PostgresServer, s3_server: S3Server,
                      root: Path) -> Iterator[MlflowPgServer]:
    """``mlflow server --backend-store-uri postgresql://...`` with artifacts proxied to bucket
    ``mlflow-pg-artifacts`` of the SeaweedFS server; its files in ``root``."""
    with running_mlflow_server(postgres.url, s3_server, "mlflow-pg-artifacts", root,
                               "mlflow server on PostgreSQL", timeout=180) as (uri, log):
        yield MlflowPgServer(uri, "mlflow-pg-artifacts", s3_server, postgres, log)


@dataclass
class RayCluster:
    address: str
    client_address: str
    env: dict[str, str]


def _ray_env() -> dict[str, str]:
    return dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_DEDUP_LOGS="0")


@contextmanager
def running_ray_cluster(s3_server: S3Server) -> Iterator[RayCluster]:
    """A head node (127.0.0.2) and one worker node (127.0.0.3), 1 CPU each, stopped by PID. The nodes get
    the S3 server's credentials (what Ray workers of a team's cluster have from their image)."""
    temp = tempfile.mkdtemp(prefix="mlt-ray-")  # short: Ray's socket paths must stay < 108
    env = dict(_ray_env(), AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET,
               AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=s3_server.endpoint)
    port, client_port = free_port(), free_port()
    common = ["--block", "--num-cpus=1", "--object-store-memory=78643200",
              "--disable-usage-stats", "--dashboard-agent-listen-port=0", f"--temp-dir={temp}"]
    ray = os.path.join(BIN, "ray")
    procs: list[subprocess.Popen] = []
    logs = [os.path.join(temp, "head.log"), os.path.join(temp, "worker.log")]
    try:
        with open(logs[0], "wb") as out:
            procs.append(subprocess.Popen(
                [ray, "start", "--head", f"--port={port}", "--include-dashboard=false",
                 f"--ray-client-server-port={client_port}", "--node-ip-address=127.0.0.2",
                 *common],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True))
        _wait(lambda: "Ray runtime started" in _tail(logs[0], 100000), 90, "ray head", procs[0],
              logs[0])
        with open(logs[1], "wb") as out:
            procs.append(subprocess.Popen(
                [ray, "start", f"--address=127.0.0.2:{port}", "--node-ip-address=127.0.0.3",
                 *common],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True))
        _wait(lambda: "Ray runtime started" in _tail(logs[1], 100000), 90, "ray worker",
              procs[1], logs[1])
        time.sleep(1)
        yield RayCluster(f"127.0.0.2:{port}", f"ray://127.0.0.2:{client_port}", _ray_env())
    finally:
        for proc in reversed(procs):
            stop(proc, timeout=5)  # SIGTERM makes Ray drain up to 30 s; SIGKILL after 5
        shutil.rmtree(temp, ignore_errors=True)
