"""Who this process and this replica are in a distributed TensorFlow job.

Workers are named as smdebug names them: by Horovod's rank when the job initialized Horovod,
else by TF_CONFIG's task (``<type>_<index>``). Within one process, a distribution strategy
(MirroredStrategy) runs the step once per replica: only the first replica saves in-step values.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import tensorflow as tf


def horovod() -> Any:
    """``horovod.tensorflow`` if the job imported and initialized it, else None (never imported
    here: importing it loads MPI)."""
    module = sys.modules.get("horovod.tensorflow")
    try:
        return module if module is not None and module.is_initialized() else None
    except Exception:  # noqa: BLE001 - horovod not usable: single worker
        return None


def tf_config() -> tuple[dict[str, Any], int] | None:
    """(this task, the number of workers and chiefs) from TF_CONFIG, or None without one."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "null")
        task, cluster = config["task"], config["cluster"]
        return task, len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    except (ValueError, TypeError, KeyError):
        return None


def has_chief() -> bool:
    """True if TF_CONFIG's cluster names a chief."""
    try:
        return "chief" in json.loads(os.environ["TF_CONFIG"])["cluster"]
    except (KeyError, ValueError, TypeError):
        return False


def in_first_replica() -> bool:
    """False while tracing the step of a replica other than the first under a distribution
    strategy (MirroredStrategy traces the step once per replica, each on its own thread): only
    replica 0 saves in-step values, so a step holds one replica's values, always the same one."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return True
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    return replica is None or int(replica) == 0
