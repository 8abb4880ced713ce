"""The configuration of ``mltrace run``: smdebug's JSON document, merged with command-line options.

The document has smdebug's shape (``LocalPath``, ``HookParameters``, ``CollectionConfigurations``;
see mltrace.capture.json_config). It comes from ``--config FILE``, else from the file named by
``MLTRACE_CONFIG_FILE_PATH`` / ``SMDEBUG_CONFIG_FILE_PATH``; command-line hook options override
its keys. ``mltrace run`` validates it once, before the script starts, and hands it to every
process of the job inline in ``MLTRACE_RUN_CONFIG`` (a child process, e.g. a torchrun worker,
cannot be given it any other way).
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from collections.abc import Mapping
from typing import Any

from mltrace.capture.json_config import CONFIG_ENV_VARS, config_file_path, parse_hook_config
from mltrace.capture.recorder_config import check_collections
from mltrace.collections import CollectionKeys
from mltrace.exceptions import MltraceValueError
from mltrace.format.paths import END_OF_JOB_MARKER
from mltrace.stability.signals import COLLECTIONS as STABILITY_COLLECTIONS

#: The resolved document, inline JSON, in the environment of the script and its children.
RUN_CONFIG_ENV = "MLTRACE_RUN_CONFIG"
#: Every built-in collection of every framework (smdebug's names, and the stability signals'
#: that the PyTorch hook creates when named); others need an include_regex.
BUILTIN_COLLECTIONS = frozenset(
    v for k, v in vars(CollectionKeys).items() if not k.startswith("_") and isinstance(v, str)
) | set(STABILITY_COLLECTIONS)


def read_config_file(path: str | None) -> dict[str, Any]:
    """The JSON document of ``path`` (or of the file the environment names); {} when neither.

    Raises:
        FileNotFoundError: the file named does not exist.
        MltraceValueError: the file is not a JSON object.
    """
    if path is None and not any(os.environ.get(v) for v in CONFIG_ENV_VARS):
        return {}
    path = config_file_path(path)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except ValueError as exc:
        raise MltraceValueError(
            f"hook configuration file {path!r} is not valid JSON ({exc}); it must be smdebug's "
            "format: {\"LocalPath\": ..., \"HookParameters\": {...}, "
            "\"CollectionConfigurations\": [...]}") from None
    if not isinstance(doc, dict):
        raise MltraceValueError(
            f"hook configuration file {path!r} holds a JSON {type(doc).__name__}, not smdebug's "
            "object {\"LocalPath\": ..., \"HookParameters\": {...}, \"CollectionConfigurations\": [...]}")
    return doc


def merge_options(doc: Mapping[str, Any], out_dir: str | None = None,
                  hook_parameters: Mapping[str, str] | None = None,
                  collections: list[str] | None = None,
                  flight_recorder: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``doc`` with command-line options applied: ``out_dir`` replaces LocalPath, each hook
    parameter replaces its key, each collection not configured yet is added, ``flight_recorder``
    (FlightRecorder keys; empty: the defaults) turns the recorder on and replaces those keys.
    LocalPath is made absolute, so that processes started elsewhere write the same trial."""
    merged = copy.deepcopy(dict(doc))
    if out_dir:
        merged["LocalPath"] = out_dir
    if hook_parameters:
        params = dict(merged.get("HookParameters") or {})
        params.update(hook_parameters)
        merged["HookParameters"] = params
    if collections:
        entries = list(merged.get("CollectionConfigurations") or [])
        named = {e.get("CollectionName") for e in entries if isinstance(e, Mapping)}
        entries += [{"CollectionName": c} for c in collections if c not in named]
        merged["CollectionConfigurations"] = entries
    if flight_recorder is not None:
        recorder = merged.get("FlightRecorder")
        merged["FlightRecorder"] = {**(recorder if isinstance(recorder, Mapping) else {}),
                                    **flight_recorder}
    local = merged.get("LocalPath")
    if isinstance(local, str) and local and "://" not in local:
        merged["LocalPath"] = os.path.abspath(local)
    return merged


def validate(doc: Mapping[str, Any], where: str) -> None:
    """Check ``doc`` as every hook will read it, before any process starts.

    Raises:
        MltraceValueError: not smdebug's format, no LocalPath, an invalid key or value, or a
            collection that is no built-in and says what it holds with no include_regex.
    """
    if not doc.get("LocalPath"):
        raise MltraceValueError(
            f"{where}: no trial directory: pass --out-dir DIR or set LocalPath in the JSON file")
    config = parse_hook_config(doc, where)
    out_dir = str(doc["LocalPath"])
    if "://" not in out_dir:
        from mltrace.capture.out_dir import check_local_out_dir  # a file in the way, no permission

        try:
            check_local_out_dir(out_dir, os.path.join(out_dir, END_OF_JOB_MARKER))
        except MltraceValueError as exc:
            raise MltraceValueError(f"{where}: {exc}") from None
    if "://" not in out_dir and os.path.exists(os.path.join(out_dir, END_OF_JOB_MARKER)):
        raise MltraceValueError(
            f"{where}: the trial directory {out_dir!r} holds a finished run ({END_OF_JOB_MARKER} "
            "exists): use a new --out-dir, or delete that one to overwrite it")
    recorder = config.hook_kwargs.get("flight_recorder")
    if recorder is not None and recorder.collections is not None:
        try:
            check_collections(recorder.collections, BUILTIN_COLLECTIONS | set(config.collections))
        except MltraceValueError as exc:
            raise MltraceValueError(f"{where}: FlightRecorder: {exc}") from None
    for name, settings in config.collections.items():
        if name not in BUILTIN_COLLECTIONS and not settings.get("include_regex"):
            close = difflib.get_close_matches(name, sorted(BUILTIN_COLLECTIONS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise MltraceValueError(
                f"{where}: unknown collection {name!r}{hint}: it is not a built-in collection "
                f"({', '.join(sorted(BUILTIN_COLLECTIONS))}) and gives no include_regex; fix the "
                "name, or give it CollectionParameters {\"include_regex\": \"...\"}")


def run_config_from_environment() -> dict[str, Any] | None:
    """The document a process of ``mltrace run`` works with: inline from MLTRACE_RUN_CONFIG, else
    the file MLTRACE_CONFIG_FILE_PATH / SMDEBUG_CONFIG_FILE_PATH names; None when neither is set."""
    inline = os.environ.get(RUN_CONFIG_ENV)
    if inline:
        doc = json.loads(inline)
        if not isinstance(doc, dict):
            raise MltraceValueError(f"{RUN_CONFIG_ENV} must hold a JSON object, got {inline[:80]!r}")
        return doc
    doc = read_config_file(None)
    return merge_options(doc) if doc else None
