"""Rule executions on an existing Ray cluster (``mltrace watch --ray-address``).

A rule on a trial that is still training runs in an actor of its own (one per live rule, killed
when the rule ends); a rule on a finished trial is a plain Ray task. Both call
``run_execution``, so results, MLflow runs and state are the same as with the local pool. The
cluster's workers get the watcher's ``AWS_*``, ``MLFLOW_*`` and ``MLTRACE_*`` variables through
the job's runtime environment, so they reach the same S3 and tracking server. Actors and tasks
belong to the watcher's job: Ray ends them when the watcher goes away.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from concurrent.futures import Future
from typing import Any

from mltrace.exceptions import MltraceRuntimeError, MltraceValueError
from mltrace.watch.execution import Execution, run_execution
from mltrace.watch.state import Outcome

logger = logging.getLogger(__name__)

#: environment variables the cluster's workers need to reach the watcher's storage and tracking
FORWARDED_PREFIXES = ("AWS_", "MLFLOW_", "MLTRACE_", "S3_")


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MltraceValueError(
            "--ray-address needs Ray: pip install 'mltrace[ray]' (or leave --ray-address out "
            "to run rules in a local process pool)") from None
    return ray


def forwarded_env() -> dict[str, str]:
    """The variables the cluster's workers get (see the module docstring)."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}


class RayExecutor:
    """Connects to the Ray cluster at ``address`` and runs executions there.

    Args:
        address: ``auto``, ``host:port`` of the head's GCS, or ``ray://host:port`` (Ray Client).
        num_cpus: CPUs Ray reserves per rule execution (rules mostly wait for steps).

    Raises:
        MltraceValueError: Ray is not installed.
        MltraceRuntimeError: no cluster answers at ``address`` (the message names it and how to
            start one).
    """

    def __init__(self, address: str, num_cpus: float = 0.5) -> None:
        ray = _import_ray()
        self.address = address
        self.num_cpus = num_cpus
        _check_reachable(address)
        _connect(ray, address)
        self._ray = ray
        self._task = ray.remote(run_execution).options(num_cpus=num_cpus, max_retries=0)
        self._actor_cls = ray.remote(_RuleActor).options(num_cpus=num_cpus, max_restarts=0)
        self._actors: dict[tuple[str, str], Any] = {}
        resources = ray.cluster_resources()
        self.description = (f"Ray cluster at {address} ({resources.get('CPU', 0):g} CPUs, "
                            f"{len(ray.nodes())} nodes)")

    def submit(self, execution: Execution, live: bool) -> Future[Outcome]:
        """A Ray task for a finished trial; an actor of its own for a live one."""
        if not live:
            return self._task.remote(execution).future()
        actor = self._actor_cls.remote()
        self._actors[(execution.trial, execution.key)] = actor
        return actor.run.remote(execution).future()

    def release(self, execution: Execution) -> None:
        """Kill the execution's actor, if it had one."""
        actor = self._actors.pop((execution.trial, execution.key), None)
        if actor is not None:
            self._ray.kill(actor, no_restart=True)

    def shutdown(self) -> None:
        """Kill the actors and leave the cluster (which ends the job's tasks)."""
        for actor in self._actors.values():
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception as exc:
                logger.debug("could not kill actor: %s", exc)
        self._actors.clear()
        self._ray.shutdown()


#: Ray Client's proxy starts a server per client and can fail to under load; tries in all
CLIENT_CONNECT_ATTEMPTS = 3


def _connect(ray: Any, address: str) -> None:
    """``ray.init`` at ``address``; a Ray Client connection the server aborts while starting
    (``ConnectionAbortedError``: its per-client server did not come up in time, which happens
    on a loaded head node) is tried again, up to CLIENT_CONNECT_ATTEMPTS times.

    Raises:
        MltraceRuntimeError: the cluster did not accept the connection; names the address, the
            cause (the last line of the server's traceback for Ray Client) and what to do.
    """
    for attempt in range(1, CLIENT_CONNECT_ATTEMPTS + 1):
        try:
            ray.init(address=address, runtime_env={"env_vars": forwarded_env()},
                     logging_level=logging.WARNING, log_to_driver=True,
                     namespace="mltrace-watch")
            return
        except ConnectionAbortedError as exc:
            if attempt == CLIENT_CONNECT_ATTEMPTS:
                raise _connect_error(address, exc) from None
            logger.warning("the Ray cluster at %s aborted the connection (%s); trying again "
                           "(%d of %d)", address, _last_line(exc), attempt + 1,
                           CLIENT_CONNECT_ATTEMPTS)
            ray.shutdown()
            time.sleep(2.0 * attempt)
        except Exception as exc:
            raise _connect_error(address, exc) from None


def _last_line(exc: BaseException) -> str:
    """The last non-empty line of ``exc``'s message (Ray Client puts the server's traceback
    there, whose last line is the cause)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _connect_error(address: str, exc: BaseException) -> MltraceRuntimeError:
    return MltraceRuntimeError(
        f"cannot connect to the Ray cluster at --ray-address {address!r}: "
        f"{type(exc).__name__}: {_last_line(exc)}; start one with 'ray start --head' (then use "
        "'auto' or its address, or ray://HOST:10001 for Ray Client), or leave --ray-address out "
        "to use a local process pool")


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast when nothing listens at ``address`` (``ray.init`` would retry for minutes).

    Raises:
        MltraceRuntimeError: the host does not answer on that port, naming the address.
    """
    if address == "auto":
        return  # Ray reads the local cluster's address file and says when there is none
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise MltraceValueError(
            f"--ray-address {address!r}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise MltraceRuntimeError(
            f"cannot connect to the Ray cluster at --ray-address {address!r}: nothing answers "
            f"on {host}:{port} ({exc}); start one with 'ray start --head' and pass its address "
            "(HOST:6379, or ray://HOST:10001 for Ray Client), or leave --ray-address out to use "
            "a local process pool") from None


class _RuleActor:
    """A Ray actor holding one live rule execution."""

    def run(self, execution: Execution) -> Outcome:
        """Run the execution to the end of its trial's training."""
        return run_execution(execution)
