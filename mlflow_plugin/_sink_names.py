"""The metric names of a hook's MLflow sink, and who logs each one when autologging is on.

Metric names: the tensor name (``CrossEntropyLoss_output_0``) or the save_scalar name, cleaned
to MLflow's character set; in EVAL and PREDICT modes prefixed ``eval/`` and ``predict/``; step =
the global step (the x axis of the TensorBoard tab and of rule findings: every step of every
mode counts), and the mode's own step at each global step is the metric ``train/mode_step``,
``eval/mode_step`` or ``predict/mode_step`` (a chart's x axis in MLflow's UI).

Autologging: when an MLflow autologging integration is on (or the run was created by one),
metric names that something else writes in the run (autologging, or the user) are left to it:
a new name waits CLAIM_DELAY seconds (or until close) before mltrace logs it; if by then the run
has it (or autologging's pending queue does), mltrace never logs that name. So XGBoost's
``train-rmse`` appears once even with both ``mlflow.xgboost.autolog()`` and the mltrace hook on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mltrace.modes import ModeKeys

from . import _keys

#: The sink's logger, whichever of its parts logs.
logger = logging.getLogger("mltrace_mlflow.sink")

_MODE_PREFIX = {ModeKeys.EVAL: "eval/", ModeKeys.PREDICT: "predict/"}
#: The metric holding a mode's own step at each global step (see MetricBatching._flush).
MODE_STEP_METRIC = "mode_step"
#: With autologging on, seconds a new metric name waits before mltrace claims it (see _claim_keys).
CLAIM_DELAY = 10.0


class MetricNames:
    """MlflowSink's part that turns (name, mode) into a metric key and claims keys from
    autologging."""

    client: Any
    run_id: str
    prefix: str
    _autolog_run: bool
    _stopping: bool

    def _prepare_names(self) -> None:
        self._keys: dict[tuple[str, ModeKeys], str] = {}
        #: metric key -> the (name, mode) it is for
        self._key_owners: dict[str, tuple[str, ModeKeys]] = {}
        self._own_keys: set[str] = set()
        self._foreign_keys: set[str] = set()
        self._first_seen: dict[str, float] = {}
        #: queued points whose key is not claimed yet, for the next flush
        self._held: list[tuple] = []

    def _key(self, name: str, mode: ModeKeys) -> str:
        """The metric key of ``name`` in ``mode``: cleaned to MLflow's rules, and distinct per
        name, so that names that clean to the same key ('a//b' and 'a/b', two long names with
        the same first 250 characters) never share (and mix) one metric."""
        key = self._keys.get((name, mode))
        if key is None:
            prefix = self.prefix + _MODE_PREFIX.get(mode, "")
            key = _keys.clean_key(name, prefix)
            owner = self._key_owners.setdefault(key, (name, mode))
            if owner != (name, mode):
                key = _keys.unique_key(key, prefix + name)
                self._key_owners[key] = (name, mode)
            if key != prefix + name:
                logger.info("%r is logged to MLflow as the metric %r (MLflow's rules for names)",
                            name, key)
            self._keys[(name, mode)] = key
        return key

    def _mode_step_key(self, mode: ModeKeys) -> str:
        """``train/mode_step``, ``eval/mode_step``, ``predict/mode_step`` (with metric_prefix)."""
        return _keys.clean_key(f"{mode.name.lower()}/{MODE_STEP_METRIC}", self.prefix)

    def _autologging(self) -> bool:
        if self._autolog_run:
            return True
        try:
            from mlflow.utils.autologging_utils import AUTOLOGGING_INTEGRATIONS
        except ImportError:  # pragma: no cover - older MLflow
            return False
        return any(not cfg.get("disable", True) for cfg in list(AUTOLOGGING_INTEGRATIONS.values()))

    def _claim_keys(self, items: list[tuple]) -> list[tuple]:
        """With autologging on, decide who owns each new metric name. A name is claimed only
        once it has waited CLAIM_DELAY seconds (or at close), so autologging, which logs in its
        own batches, has had time to write it first; names that the run then has from another
        writer stay with that writer. Items of names still waiting are held for the next flush."""
        now = time.monotonic()
        undecided = {self._key(n, m) for n, m, *_ in items} - self._own_keys - self._foreign_keys
        for key in undecided:
            self._first_seen.setdefault(key, now)
        ready = {k for k in undecided if self._stopping or now - self._first_seen[k] >= CLAIM_DELAY}
        if ready:
            present = set(self.client.get_run(self.run_id).data.metrics)
            try:  # autologging's own queue (PyTorch SummaryWriter scalars it has not sent yet)
                from mlflow.utils.autologging_utils import metrics_queue

                # MLflow internal: no public API lists what autologging holds unsent (flushing it
                # would send it, from our thread); read-only, and any failure is ignored below.
                queued = list(metrics_queue._metrics_queue)
                present |= {m.key for rid, m in queued if rid == self.run_id}
            except Exception:  # pragma: no cover - internal of MLflow; best effort
                pass
            for key in sorted(ready & present):
                logger.info("metric %r is logged by MLflow autologging (or your code) in run %s: "
                            "mltrace does not log it a second time", key, self.run_id)
                self._foreign_keys.add(key)
            self._own_keys |= ready - present
        waiting = undecided - ready
        if not waiting:
            return items
        self._held = [i for i in items if self._key(i[0], i[1]) in waiting]
        return [i for i in items if self._key(i[0], i[1]) not in waiting]
