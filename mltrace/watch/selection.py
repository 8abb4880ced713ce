"""Which configured rules apply to a trial: a glob over its path and the tags of its MLflow
training run (found through the run file the hook writes into the trial).

MLflow is imported only when a rule selects by tags. A trial whose run file has not appeared
yet is undecided (asked again at the next poll) until training ends without one.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from typing import Any

from mltrace.format import paths
from mltrace.watch.discovery import FoundTrial
from mltrace.watch.spec import TrialSelector
from mltrace.watch.storage_cache import StorageCache

logger = logging.getLogger(__name__)


class TagSource:
    """The tags of each trial's MLflow training run, looked up once per trial and cached."""

    def __init__(self, storages: StorageCache | None = None) -> None:
        self._tags: dict[str, dict[str, str]] = {}
        self.storages = storages or StorageCache()

    def tags(self, trial: FoundTrial) -> dict[str, str] | None:
        """The run's tags; None while the trial has no run file yet (or MLflow does not
        answer: logged, asked again later); {} for a trial that ended without one."""
        if trial.location in self._tags:
            return self._tags[trial.location]
        storage = self.storages.get(trial.location)
        try:
            run = json.loads(storage.read(paths.MLFLOW_RUN_FILE))
        except FileNotFoundError:
            if storage.exists(paths.END_OF_JOB_MARKER):
                self._tags[trial.location] = {}
                return {}
            return None
        except ValueError as exc:
            logger.warning("%s/%s is damaged (%s): the trial matches no MlflowTags selector",
                           trial.location, paths.MLFLOW_RUN_FILE, exc)
            self._tags[trial.location] = {}
            return {}
        try:
            from mlflow import MlflowClient

            tags = MlflowClient(tracking_uri=run["tracking_uri"]).get_run(run["run_id"]).data.tags
        except Exception as exc:  # the tracking server is down: ask again at the next poll
            logger.warning("cannot read the tags of MLflow run %s of trial %s (%s: %s); "
                           "trying again at the next poll", run.get("run_id"), trial.location,
                           type(exc).__name__, exc)
            return None
        self._tags[trial.location] = dict(tags)
        return self._tags[trial.location]


def selects(selector: TrialSelector, trial: FoundTrial, tag_source: TagSource) -> bool | None:
    """Whether ``selector`` takes ``trial``: True, False, or None (not known yet).

    Example:
        >>> selects(TrialSelector(path_glob="team-a/*"), FoundTrial("team-a/job1", "..."), tags)
        True
    """
    if selector.path_glob is not None and not fnmatch.fnmatchcase(trial.relative,
                                                                   selector.path_glob):
        return False
    if not selector.mlflow_tags:
        return True
    tags: Any = tag_source.tags(trial)
    if tags is None:
        return None
    return all(tags.get(k) == v for k, v in selector.mlflow_tags)
