"""What a hook's MLflow sink leaves on the run's pages: artifacts and the run's description.

At close, under ``mltrace/``: the trial's collections files, its ``tensorboard/`` folder (a
remote one, ``s3://...``, copied through a temporary folder) and a summary (HTML + JSON, see
summary.py). The run's description (``mlflow.note.content``, see description.py) is written
once training runs, so that a live run's page says what it is, and again at close.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

from mltrace.format import paths

from . import _keys

#: The sink's logger, whichever of its parts logs.
logger = logging.getLogger("mltrace_mlflow.sink")


class RunArtifacts:
    """MlflowSink's part that logs the trial's files and summary and describes the run."""

    hook: Any
    options: dict[str, Any]
    client: Any
    run_id: str
    trial: str
    _params: dict[str, str] | None
    #: whether the first description was written
    _described: bool

    def _log_artifacts(self) -> None:
        """Trial files, summary and description, unless ``artifacts=False``; a step that fails
        is logged and the others still run."""
        if not self.options.get("artifacts", True):
            return
        for step in (self._log_trial_files, self._log_summary, self._describe):
            try:
                step()
            except Exception as exc:
                logger.warning("MLflow artifacts of %s: %s failed: %s", self.trial,
                               step.__name__, exc)

    def _log_trial_files(self) -> None:
        """The collections files and the TensorBoard export, under ``mltrace/``."""
        from mltrace.storage import open_storage

        storage = self.hook.storage
        tb_dir = getattr(self.hook, "tensorboard_dir", None)
        if not tb_dir:  # hooks without the attribute: the trial's own tensorboard/ folder
            local = storage.local_path(paths.TENSORBOARD_DIR)
            tb_dir = local if local and os.path.isdir(local) else None
        copies: dict[str, tuple[Any, str]] = {
            f"collections/{os.path.basename(k)}": (storage, k)
            for k in storage.list(paths.COLLECTIONS_DIR) if paths.parse_collections_key(k)}
        if tb_dir and "://" not in tb_dir:
            if os.path.isdir(tb_dir) and os.listdir(tb_dir):
                self.client.log_artifacts(self.run_id, tb_dir,
                                          f"{_keys.ARTIFACT_DIR}/{paths.TENSORBOARD_DIR}")
        elif tb_dir:  # remote (s3://...): copy through a temporary folder
            tb_storage = open_storage(tb_dir)
            copies.update({f"{paths.TENSORBOARD_DIR}/{k}": (tb_storage, k)
                           for k in tb_storage.list("")})
        if not copies:
            return
        tmp = tempfile.mkdtemp(prefix="mltrace-mlflow-")
        try:
            for rel, (where, key) in copies.items():
                target = os.path.join(tmp, *rel.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(where.read(key))
            self.client.log_artifacts(self.run_id, tmp, _keys.ARTIFACT_DIR)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _log_summary(self) -> None:
        if not self.options.get("summary", True) or self.hook.step < 0:
            return
        from . import summary

        summary.log_summary(self.client, self.run_id, self.trial)

    def _describe(self) -> None:
        """The run's description: trial, steps, collections, rule findings (Markdown)."""
        from . import description

        description.update_training_description(self.client, self.run_id)

    def _describe_early(self) -> None:
        """Once training runs, a first description (trial, collections; rules add their
        findings as they run): a live run's page says what it is before close rewrites it."""
        if self._params is None or self._described:
            return
        self._described = True
        try:
            self._describe()
        except Exception as exc:
            logger.debug("first description of run %s: %s", self.run_id, exc)
