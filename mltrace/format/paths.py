"""Where things live inside a trial (out_dir), relative to it, as smdebug 1.0.34 lays them out::

    collections/000000000/<worker>_collections.json
    events/<STEP:012>/<STEP:012>_<worker>.tfevents       one per (global step, worker)
    index/<STEP//1000:09>/<STEP:012>_<worker>.json       one per events file
    training_job_end.ts                                  empty end-of-training marker
    tensorboard/                                         TensorBoard exports (never under events/)

Keys use "/" whatever the OS: the storage layer maps them to local paths or S3 keys.
"""

from __future__ import annotations

import re

EVENTS_DIR = "events"
INDEX_DIR = "index"
COLLECTIONS_DIR = "collections/000000000"
END_OF_JOB_MARKER = "training_job_end.ts"
TENSORBOARD_DIR = "tensorboard"
#: written by hooks that log to MLflow (mltrace_mlflow); smdebug's reader never looks at it.
MLFLOW_RUN_FILE = "mltrace_mlflow_run.json"
#: written by a rule's StopTraining action; hooks watch for it and end training at a step boundary.
STOP_SIGNAL_FILE = "mltrace_stop_training.json"
#: one empty file per worker that finished (``<dir>/<worker>``), written before the end marker:
#: with several workers, the first to finish writes the end marker while others still train, so
#: mltrace's reader also waits for every worker's file (smdebug-written trials have none).
WORKERS_DONE_DIR = "mltrace_done"
#: one JSON per rule execution (mltrace.rules.results), read by the TensorBoard plugin.
RULE_RESULTS_DIR = "mltrace_rules"
#: one JSON per worker, the last diagnosis of its trial (mltrace.diagnosis.stored): ``mltrace
#: diagnose`` after a flight-recorder dump and ``mltrace watch`` write it; the TensorBoard
#: plugin and MLflow show it.
DIAGNOSIS_DIR = "mltrace_diagnosis"
#: one JSON per rule execution that ``mltrace watch`` finished (mltrace.watch.state): what a
#: restarted watcher skips.
WATCH_STATE_DIR = "mltrace_watch"
INDEX_FILES_PER_PREFIX = 1000
DEFAULT_WORKER_NAME = "worker_0"

_INDEX_NAME = re.compile(r"^index/(\d{9})/(\d{12})_(.+)\.json$")
_EVENT_NAME = re.compile(r"^events/(\d{12})/(\d{12})_(.+)\.tfevents$")
_COLLECTIONS_NAME = re.compile(r"^collections/\d+/(.+)_collections\.json$")
_WORKER_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def event_file_key(step: int, worker: str) -> str:
    """Key of the events file of a global step and worker."""
    return f"{EVENTS_DIR}/{step:012d}/{step:012d}_{worker}.tfevents"


def index_prefix(step: int) -> str:
    """Key of the index folder that holds ``step`` (1000 steps per folder)."""
    return f"{INDEX_DIR}/{step // INDEX_FILES_PER_PREFIX:09d}"


def index_file_key(step: int, worker: str) -> str:
    """Key of the index file of a global step and worker."""
    return f"{index_prefix(step)}/{step:012d}_{worker}.json"


def collections_file_key(worker: str) -> str:
    """Key of a worker's collections file."""
    return f"{COLLECTIONS_DIR}/{worker}_collections.json"


def parse_index_key(key: str) -> tuple[int, str] | None:
    """Return (global step, worker) for an index file key, or None if it is not one."""
    match = _INDEX_NAME.fullmatch(key)
    if not match:
        return None
    return int(match.group(2)), match.group(3)


def parse_event_key(key: str) -> tuple[int, str] | None:
    """Return (global step, worker) for an events file key, or None if it is not one."""
    match = _EVENT_NAME.fullmatch(key)
    if not match or match.group(1) != match.group(2):
        return None
    return int(match.group(2)), match.group(3)


def parse_collections_key(key: str) -> str | None:
    """Return the worker of a collections file key, or None if it is not one."""
    match = _COLLECTIONS_NAME.fullmatch(key)
    return match.group(1) if match else None


def check_worker_name(worker: str) -> str:
    """Return ``worker`` if it is safe in a file name, else raise ValueError naming the fix."""
    if not _WORKER_NAME.fullmatch(worker) or worker in (".", ".."):
        raise ValueError(
            f"worker name {worker!r} cannot be part of a file name: use letters, digits, '_', '-' "
            "and '.' only (e.g. 'worker_0')"
        )
    return worker
