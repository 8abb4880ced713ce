"""MLflow's limits on names and values, and the tag names mltrace writes.

MLflow (mlflow/utils/validation.py) accepts metric, param and tag names made of word characters,
``/ . - space`` and ``:`` (not on Windows) that do not normalise to another path (``a//b``,
``./x``, ``x/`` are rejected), at most 250 characters; param values up to 6000 characters, tag
values up to 8000; a batch holds at most 1000 metrics, 100 params and 100 tags, 1000 entities in
all. Everything mltrace logs goes through these helpers, so a tensor called ``fc1:0`` or a 9000
character message never makes a logging call fail.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from typing import Any

MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100

# Tags mltrace writes (namespaced: mltrace never writes mlflow.* except mlflow.parentRunId).
TAG_TRIAL = "mltrace.trial"
TAG_VERSION = "mltrace.version"
TAG_FRAMEWORK = "mltrace.framework"
TAG_RUN_TYPE = "mltrace.run_type"  # training | rule | comparison
TAG_RULE = "mltrace.rule"
TAG_RULE_STATUS = "mltrace.rule_status"
TAG_FIRST_STEP = "mltrace.first_step"
TAG_MESSAGE = "mltrace.message"
TAG_ISSUES_FOUND = "mltrace.issues_found"
TAG_EXECUTION = "mltrace.watch.execution"  # a rule run's execution key under `mltrace watch`
RULE_TAG_PREFIX = "mltrace.rule."  # on the training run: mltrace.rule.<Rule>.<field>
# On the training run when its hook's flight recorder dumps (mltrace_mlflow.flight_recorder).
TAG_FIRST_NONFINITE_TENSOR = "mltrace.first_nonfinite.tensor"
TAG_FIRST_NONFINITE_STEP = "mltrace.first_nonfinite.step"
TAG_FLIGHT_RECORDER_DUMPS = "mltrace.flight_recorder.dumps"
TAG_FLIGHT_RECORDER_LAST_TRIGGER = "mltrace.flight_recorder.last_trigger"
TAG_FLIGHT_RECORDER_LAST_REASON = "mltrace.flight_recorder.last_reason"
PARENT_RUN_TAG = "mlflow.parentRunId"
ARTIFACT_DIR = "mltrace"

_BAD_CHARS = re.compile(r"[^\w/.\- ]" if os.name == "nt" else r"[^\w/.\- :]")


def clean_key(name: str, prefix: str = "") -> str:
    """A valid MLflow metric/param/tag name for ``prefix + name``: other characters become ``_``,
    empty, ``.`` and ``..`` path parts are dropped, and the result is cut to 250 characters.

    Example:
        >>> clean_key("gradient//conv1.weight[0]")
        'gradient/conv1.weight_0_'
    """
    key = _BAD_CHARS.sub("_", prefix + str(name))
    parts = [p for p in key.split("/") if p not in ("", ".", "..")]
    key = "/".join(parts)[:MAX_KEY_LENGTH].rstrip("/")
    if not key or posixpath.normpath(key) != key:
        key = key.replace("/", "_") or "_"
    return key


def unique_key(key: str, name: str) -> str:
    """``key`` (a clean_key result) made distinct for ``name``, for when another name already
    uses it: its last 9 characters give way to ``_`` and 8 hex digits of a hash of ``name``
    (stable across runs), within the 250-character limit.

    Example:
        >>> unique_key("a/b", "a//b")
        'a/b_586cec69'
    """
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    out = f"{key[:MAX_KEY_LENGTH - 9]}_{digest}"
    return out if posixpath.normpath(out) == out else out.replace("/", "_")


def rule_tag(rule_name: str, field: str) -> str:
    """Name of the tag a rule leaves on the training run, e.g.
    ``mltrace.rule.VanishingGradient.status``."""
    return clean_key(f"{RULE_TAG_PREFIX}{rule_name}.{field}")


def clip(value: Any, limit: int) -> str:
    """``str(value)`` cut to ``limit`` characters (marking the cut), so MLflow never refuses it."""
    text = str(value)
    if len(text) <= limit:
        return text
    marker = "... [truncated]"
    return text[: limit - len(marker)] + marker


def param_value(value: Any) -> str:
    """A param value within MLflow's 6000-character limit."""
    return clip(value, MAX_PARAM_VALUE_LENGTH)


def tag_value(value: Any) -> str:
    """A tag value within MLflow's 8000-character limit."""
    return clip(value, MAX_TAG_VALUE_LENGTH)


def chunks(items: list, size: int) -> list[list]:
    """``items`` in lists of at most ``size`` (MLflow's batch limits)."""
    return [items[i : i + size] for i in range(0, len(items), size)]
