"""What ``mltrace watch`` remembers, kept in each trial: one small JSON per finished rule
execution under ``mltrace_watch/`` (beside the rule results of ``mltrace_rules/``).

A restarted watcher reads it and skips those executions; an execution that was running when the
watcher died has no file and runs again, resuming its MLflow run (the run carries the execution
key as a tag, see mltrace_mlflow.rules), so nothing is duplicated and nothing already written is
lost. The watcher's own disk holds no state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from mltrace.format import paths
from mltrace.rules.results import RuleFindings
from mltrace.storage import Storage, open_storage

logger = logging.getLogger(__name__)

FINISHED = "finished"  # the rule ran to the trial's end (or its end-step)
FAILED = "failed"  # the rule raised: its MLflow run is FAILED with the traceback
DELETED = "deleted"  # the trial disappeared while the rule ran
UNAVAILABLE = "unavailable"  # the trial could not be opened: tried again (never recorded)


@dataclass
class Outcome(RuleFindings):
    """What one rule execution ended with (also the JSON kept in the trial): the watcher's
    status and error, and the rule's status and findings."""

    trial: str
    key: str
    rule: str
    status: str
    rule_status: str | None = None
    error: str | None = None
    started: float = 0.0
    ended: float = 0.0
    host: str = ""
    #: what the diagnosis after the rule did (mltrace.watch.diagnosis: "published", "up to
    #: date", ...); None when it did not run (``--no-diagnose``, a trial deleted or unreadable)
    diagnosis: str | None = None

    def to_json(self) -> str:
        """The outcome as JSON text."""
        return json.dumps(asdict(self), sort_keys=True)


def state_key(execution_key: str) -> str:
    """Where a finished execution's outcome lives inside its trial."""
    return f"{paths.WATCH_STATE_DIR}/{execution_key}.json"


def finished_keys(location: str, storage: Storage | None = None) -> set[str]:
    """Execution keys recorded as finished in the trial at ``location`` (read through
    ``storage`` when given)."""
    storage = storage or open_storage(location)
    out = set()
    for key in storage.list(paths.WATCH_STATE_DIR):
        if key.endswith(".json"):
            out.add(key[len(paths.WATCH_STATE_DIR) + 1:-len(".json")])
    return out


def record(outcome: Outcome, storage: Storage | None = None) -> None:
    """Write ``outcome`` into its trial (through ``storage`` when given; a warning when the
    trial cannot be written)."""
    try:
        (storage or open_storage(outcome.trial)).write(state_key(outcome.key), outcome.to_json().encode())
    except Exception as exc:
        logger.warning("could not record the end of %s in %s: %s (it will run again after a "
                       "restart, resuming its MLflow run)", outcome.key, outcome.trial, exc)


def read_outcome(location: str, execution_key: str) -> dict[str, Any] | None:
    """A recorded outcome as a dict, or None."""
    try:
        return json.loads(open_storage(location).read(state_key(execution_key)))
    except (FileNotFoundError, ValueError):
        return None
