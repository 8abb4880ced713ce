"""Which tracking store, which experiment, and the run file a hook leaves in its trial.

Tracking URI: the one given, else MLflow's (``mlflow.set_tracking_uri`` / MLFLOW_TRACKING_URI),
else SQLite in the working directory (MLflow 3's default). mltrace never falls back to the
deprecated file store: where MLflow's implicit default would be ``./mlruns`` (a folder that
already holds runs), ``sqlite:///<cwd>/mlflow.db`` is used instead, with a warning. Relative
SQLite paths are made absolute, so that the run file names a store that a rule job started
from another directory still finds, and experiments mltrace creates in a SQLite store keep their
artifacts beside the database (``<db folder>/mlruns/<experiment>``), not in the working directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from mltrace import __version__
from mltrace.exceptions import MltraceValueError
from mltrace.format import paths

from . import links

logger = logging.getLogger(__name__)

PARENT_RUN_ENV = "MLTRACE_MLFLOW_PARENT_RUN_ID"


@dataclass
class RunFile:
    """What ``mltrace_mlflow_run.json`` in a trial says (smdebug's reader never looks at it)."""

    run_id: str
    experiment_id: str
    tracking_uri: str
    artifact_uri: str | None = None
    mltrace_version: str = __version__
    written: float = 0.0


def _is_file_store(uri: str) -> bool:
    scheme = uri.split(":", 1)[0].lower() if "://" in uri or uri.startswith("file:") else ""
    return scheme in ("", "file")


def absolute_uri(uri: str) -> str:
    """``sqlite:///relative.db`` made absolute (other URIs unchanged)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        return prefix + os.path.abspath(uri[len(prefix):])
    return uri


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """The tracking URI to use (see the module docstring).

    Raises:
        MltraceValueError: ``explicit`` names a file store.
    """
    import mlflow

    if explicit:
        if _is_file_store(explicit):
            raise MltraceValueError(
                f"tracking_uri={explicit!r} is MLflow's deprecated file store; use "
                "'sqlite:///path/to/mlflow.db' or an MLflow server's http:// URI"
            )
        return absolute_uri(explicit)
    uri = mlflow.get_tracking_uri()
    if _is_file_store(uri) and not mlflow.is_tracking_uri_set():
        sqlite = "sqlite:///" + os.path.abspath("mlflow.db")
        logger.warning(
            "MLflow's default here would be the deprecated file store %s; mltrace logs to "
            "%s instead (set MLFLOW_TRACKING_URI to choose)",
            uri,
            sqlite,
        )
        return sqlite
    return absolute_uri(uri)


def existing_store(explicit: str | None = None) -> str:
    """The tracking URI of a store to read from, never creating one: commands that only read
    (``mltrace compare``) must not leave an empty ``./mlflow.db`` behind when the user forgot to
    say where the runs are.

    ``explicit``, else MLflow's configured URI, else ``./mlflow.db`` when that file exists (with a
    warning saying so).

    Raises:
        MltraceValueError: no tracking URI is set and there is no ./mlflow.db, or the SQLite file
            a URI names does not exist.
    """
    if not explicit and not tracking_configured():
        local = os.path.abspath("mlflow.db")
        if not os.path.isfile(local):
            raise MltraceValueError(
                "no MLflow tracking URI is set and there is no mlflow.db here: set "
                "MLFLOW_TRACKING_URI or pass --tracking-uri (e.g. sqlite:////path/to/mlflow.db "
                "or http://127.0.0.1:5000); nothing was created")
        logger.warning("no MLflow tracking URI set: reading %s (set MLFLOW_TRACKING_URI to "
                       "choose)", local)
        return "sqlite:///" + local
    uri = resolve_tracking_uri(explicit)
    prefix = "sqlite:///"
    if uri.startswith(prefix) and ":memory:" not in uri:
        path = uri[len(prefix):].split("?", 1)[0]
        if not os.path.isfile(path):
            raise MltraceValueError(
                f"tracking URI {uri!r} names a SQLite file that does not exist: check the path "
                "(nothing was created)")
    return uri


def tracking_configured() -> bool:
    """True when the user pointed MLflow somewhere (env var or mlflow.set_tracking_uri)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return True
    import sys

    if "mlflow" not in sys.modules:  # set_tracking_uri needs mlflow imported: not called then
        return False
    import mlflow

    return bool(mlflow.is_tracking_uri_set())


def experiment_id_for(
    client: Any,
    name: str | None = None,
    experiment_id: str | None = None,
    fluent_store: bool = True,
) -> str:
    """The id of experiment ``name`` (created if missing, tagged a machine-learning experiment),
    or ``experiment_id``, or the active experiment (MLFLOW_EXPERIMENT_NAME, and where ``client``
    talks to MLflow's current store also mlflow.set_experiment and MLFLOW_EXPERIMENT_ID), else
    the default one ("0")."""
    if experiment_id:
        return str(experiment_id)
    if name:
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            # Tagged as a machine-learning experiment, as MLflow's UI tags one when the user picks
            # its kind (mltrace_mlflow.links says how the UI chooses its view).
            return client.create_experiment(
                name, artifact_location=_artifact_location(client, name),
                tags={links.EXPERIMENT_KIND_TAG: links.MACHINE_LEARNING_KIND},
            )
        except Exception:  # created meanwhile by another process
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id
    from mlflow.tracking.fluent import _get_experiment_id

    env_name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if env_name and not os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return experiment_id_for(client, env_name)
    if not fluent_store:
        return "0"
    return _get_experiment_id() or "0"


def _artifact_location(client: Any, name: str) -> str | None:
    """For an experiment mltrace creates in a SQLite store: ``<db folder>/mlruns/<name>``, so that
    artifacts sit beside the database wherever the process runs (MLflow's default is ./mlruns of
    the current directory). Other stores keep their own default (None)."""
    uri = str(getattr(client, "tracking_uri", "") or "")
    prefix = "sqlite:///"
    if not uri.startswith(prefix + "/") or ":memory:" in uri:
        return None
    folder = re.sub(r"[^\w.\- ]", "_", name).strip(". ") or "experiment"
    return os.path.join(os.path.dirname(uri[len(prefix) :]), "mlruns", folder)


def trial_location(out_dir: str) -> str:
    """The trial as a tag value: an absolute path for local trials, the URI otherwise."""
    return out_dir if "://" in out_dir else os.path.abspath(out_dir)


def write_run_file(storage: Any, run: RunFile) -> None:
    """Write the run file into a trial (via the trial's storage: local or S3)."""
    run.written = time.time()
    storage.write(paths.MLFLOW_RUN_FILE, json.dumps(asdict(run), sort_keys=True).encode())


def read_run_file(storage: Any) -> RunFile | None:
    """The run file of a trial, or None (missing or damaged: logged)."""
    try:
        if not storage.exists(paths.MLFLOW_RUN_FILE):
            return None
        data = json.loads(storage.read(paths.MLFLOW_RUN_FILE))
        known = {k: v for k, v in data.items() if k in RunFile.__dataclass_fields__}
        return RunFile(**known)
    except (OSError, ValueError, TypeError) as exc:
        logger.warning(
            "ignoring the MLflow run file of %s: %s", getattr(storage, "uri", storage), exc
        )
        return None
