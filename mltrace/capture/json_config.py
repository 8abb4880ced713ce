"""Hooks from smdebug's JSON configuration file (the file SageMaker wrote as debughookconfig.json).

File shape::

    {"LocalPath": "/path/to/out_dir",
     "HookParameters": {"save_interval": "10", "include_regex": "fc1.*,fc2.*", "reductions": "mean,abs_max",
                        "train.save_interval": "5", "export_tensorboard": "false", ...},
     "CollectionConfigurations": [{"CollectionName": "weights",
                                   "CollectionParameters": {"save_interval": "100", "include_regex": "..."}}],
     "FlightRecorder": {"steps": "50", "collections": "gradients,losses", "after_steps": "10"}}

``FlightRecorder`` (mltrace's; smdebug's reader ignores it) holds FlightRecorderConfig's fields.

Every value may be a string (the SageMaker SDK sends strings). The file is named by the argument,
else by MLTRACE_CONFIG_FILE_PATH, else SMDEBUG_CONFIG_FILE_PATH, else it is SageMaker's
/opt/ml/input/config/debughookconfig.json if that exists. An invalid value is rejected
with a message naming the key, the value and the fix. An unknown key is logged as a warning with
the closest known key and otherwise ignored, as smdebug ignored it, so that every configuration
smdebug accepted keeps working; ``"strict": "true"`` in HookParameters makes it an error.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode, parse_flag
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys

logger = logging.getLogger(__name__)

CONFIG_ENV_VARS = ("MLTRACE_CONFIG_FILE_PATH", "SMDEBUG_CONFIG_FILE_PATH")
#: Where SageMaker writes the hook configuration; read when no path or variable names one.
SAGEMAKER_CONFIG_FILE = "/opt/ml/input/config/debughookconfig.json"
#: Top-level keys: ours, and the S3 ones SageMaker writes into the same file (read by no hook).
TOP_LEVEL_KEYS = ("LocalPath", "HookParameters", "CollectionConfigurations", "S3OutputPath", "S3Path",
                  "FlightRecorder")
COLLECTION_ENTRY_KEYS = frozenset({"CollectionName", "CollectionParameters"})
_SAVE_KEYS = ("save_interval", "save_steps", "start_step", "end_step")
_MODE_PREFIXES = {"train.": ModeKeys.TRAIN, "eval.": ModeKeys.EVAL,
                  "predict.": ModeKeys.PREDICT, "global.": ModeKeys.GLOBAL}
_REDUCTION_KEYS = ("reductions", "save_raw_tensor", "save_shape")
HOOK_KEYS = frozenset(
    {"save_all", "include_regex", "include_workers", "export_tensorboard", "tensorboard_dir",
     "dry_run", "mlflow", "strict", *_REDUCTION_KEYS, *_SAVE_KEYS}
    | {p + k for p in _MODE_PREFIXES for k in _SAVE_KEYS}
)
#: Keys smdebug-era configurations hold that smdebug read nowhere, and what to do instead.
IGNORED_KEY_ADVICE = {
    "include_collections": "smdebug ignored it too: the collections saved are the ones "
                           "CollectionConfigurations names (or the hook's defaults)",
}
COLLECTION_KEYS = frozenset(
    {"include_regex", "save_histogram", *_REDUCTION_KEYS, *_SAVE_KEYS}
    | {p + k for p in _MODE_PREFIXES for k in _SAVE_KEYS}
)


@dataclass
class HookConfig:
    """What a JSON file says: hook constructor arguments plus per-collection settings."""

    hook_kwargs: dict[str, Any] = field(default_factory=dict)
    collections: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: str = ""


def config_file_path(json_file_path: str | None = None) -> str:
    """The config file to read: the argument, else the first env var set, else SageMaker's
    ``/opt/ml/input/config/debughookconfig.json`` when it exists (smdebug's default there).

    Raises:
        FileNotFoundError: none given, or the file does not exist.
    """
    path = json_file_path or next((os.environ[v] for v in CONFIG_ENV_VARS if os.environ.get(v)), None)
    if not path and os.path.isfile(SAGEMAKER_CONFIG_FILE):
        path = SAGEMAKER_CONFIG_FILE
    if not path:
        raise FileNotFoundError(
            "no hook configuration file: pass create_from_json_file(path) or set "
            "MLTRACE_CONFIG_FILE_PATH (or SMDEBUG_CONFIG_FILE_PATH) to the JSON file "
            f"(on SageMaker it is {SAGEMAKER_CONFIG_FILE})"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"hook configuration file {path!r} does not exist")
    return path


def _save_config_from(layers: list[Mapping[str, Any]], where: str,
                      defaults: Mapping[str, Any] | None = None) -> SaveConfig | None:
    """SaveConfig from flat keys, layered as smdebug layers them: each layer's plain keys, then
    its mode-prefixed keys, override the layers before it (hook first, then the collection).
    ``defaults`` (an adapter's own defaults, e.g. XGBoost's save_interval 10) come first."""
    if not any(k.split(".")[-1] in _SAVE_KEYS for layer in layers for k in layer):
        return None
    layers = [defaults or {}, *layers]
    modes: dict[ModeKeys | str, SaveConfigMode | Mapping[str, Any]] = {}  # SaveConfig's parameter type
    for prefix, mode in _MODE_PREFIXES.items():
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for layer in layers:
            for key in _SAVE_KEYS:
                for source in (key, prefix + key):
                    if source in layer:
                        values[key], sources[key] = layer[source], source
        try:
            modes[mode] = SaveConfigMode(**values)
        except MltraceValueError as exc:
            used = ", ".join(f"{sources[k]}={values[k]!r}" for k in sorted(values))
            raise MltraceValueError(f"{where} ({mode.name} mode, from {used}): {exc}") from None
    return SaveConfig(mode_save_configs=modes)


def _reduction_config_from(params: Mapping[str, Any], where: str) -> ReductionConfig | None:
    """The ReductionConfig the keys ask for, None when they name none. Without ``reductions``
    the raw tensor is saved unless ``save_raw_tensor`` says otherwise: smdebug read these keys
    only beside ``reductions`` and otherwise saved raw tensors, so ``{"save_shape": true}`` alone
    saves raw tensors, as it did there, and their shapes."""
    if not any(k in params for k in _REDUCTION_KEYS):
        return None
    raw_default = "reductions" not in params
    try:
        return ReductionConfig.from_dict(
            {"reductions": params.get("reductions", ""),
             "save_raw_tensor": parse_flag("save_raw_tensor",
                                           params.get("save_raw_tensor", raw_default)),
             "save_shape": parse_flag("save_shape", params.get("save_shape", False))}
        )
    except MltraceValueError as exc:
        raise MltraceValueError(f"{where}: {exc}") from None


def _split(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _check_keys(params: Mapping[str, Any], allowed: frozenset[str], where: str,
                strict: bool = False) -> None:
    """Unknown keys: a warning each, with the closest allowed key (smdebug ignored them
    silently, and a configuration it accepted must keep working); an error when ``strict``."""
    for key in sorted(set(params) - allowed, key=str):
        close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
        advice = IGNORED_KEY_ADVICE.get(str(key))
        hint = f" ({advice})" if advice else f" (did you mean {close[0]!r}?)" if close else ""
        if strict:
            raise MltraceValueError(
                f"{where}: unknown key {key!r}{hint}; allowed keys are {sorted(allowed)} "
                "(strict is on; without it the key is ignored with a warning)")
        logger.warning("%s: ignoring the unknown key %r%s", where, key,
                       hint or f"; mltrace reads {sorted(allowed)}")


def _close_top_level_key(key: str) -> str | None:
    """The top-level key ``key`` is a misspelling of, if any: case-blind and one or two letters
    off, so that RuleConfigurations (SageMaker tools write it) is not taken for
    CollectionConfigurations."""
    close = [k for k in TOP_LEVEL_KEYS
             if difflib.SequenceMatcher(None, str(key).lower(), k.lower()).ratio() >= 0.9]
    return close[0] if close else None


def _check_top_level_keys(doc: Mapping[str, Any], path: str, strict: bool) -> None:
    """Unknown top-level keys are ignored with a warning (files SageMaker or other tools wrote
    hold more sections); a misspelt one (``HookParameter``) drops its whole section, so its
    warning names the key meant, and with ``strict`` it is an error."""
    for key in doc:
        if key in TOP_LEVEL_KEYS:
            continue
        close = _close_top_level_key(key)
        if close is not None and strict:
            raise MltraceValueError(
                f"{path}: unknown top-level key {key!r} (did you mean {close!r}?); "
                f"allowed keys are {list(TOP_LEVEL_KEYS)}")
        if close is not None:
            logger.warning("%s: ignoring the top-level key %r (did you mean %r? its settings are "
                           "not used); mltrace reads %s", path, key, close, list(TOP_LEVEL_KEYS))
        else:
            logger.warning("%s: ignoring the top-level key %r; mltrace reads %s", path, key,
                           list(TOP_LEVEL_KEYS))


def _strict(doc: Mapping[str, Any], path: str) -> bool:
    """HookParameters' ``strict`` flag, read first: it also decides how unknown keys are met."""
    params = doc.get("HookParameters")
    if not isinstance(params, Mapping) or "strict" not in params:
        return False
    return parse_flag(f"{path} HookParameters.strict", params["strict"])


def parse_hook_config(doc: Mapping[str, Any], path: str = "<dict>",
                      save_defaults: Mapping[str, Any] | None = None) -> HookConfig:
    """Turn a parsed JSON config into a HookConfig (``save_defaults``: the adapter's default
    save keys, used where the file leaves one out; smdebug's ``default_values``).

    The sections are read in the file's order of importance: the ``strict`` flag first (it
    decides how unknown keys are met), then HookParameters and LocalPath, then each collection,
    then the FlightRecorder.

    Raises:
        MltraceValueError: unknown keys or invalid values, naming key, value and fix.
    """
    if not isinstance(doc, Mapping):
        raise MltraceValueError(f"{path}: the configuration must be a JSON object")
    strict = _strict(doc, path)
    _check_top_level_keys(doc, path, strict)
    params = doc.get("HookParameters") or {}
    if not isinstance(params, Mapping):
        raise MltraceValueError(f"{path}: HookParameters must be an object, got {params!r}")
    _check_keys(params, HOOK_KEYS, f"{path} HookParameters", strict)
    kwargs = {"out_dir": _out_dir(doc, path),
              **_hook_kwargs(params, f"{path} HookParameters", save_defaults)}
    collections = dict(_collection_settings(doc, params, path, strict, save_defaults))
    kwargs["include_collections"] = list(collections) or None
    if doc.get("FlightRecorder") is not None:
        kwargs["flight_recorder"] = FlightRecorderConfig.parse(doc["FlightRecorder"],
                                                               f"{path} FlightRecorder")
    return HookConfig(hook_kwargs=kwargs, collections=collections, path=path)


def _out_dir(doc: Mapping[str, Any], path: str) -> str:
    """LocalPath, the hook's out_dir: required, a string (a near miss such as ``localPath`` is
    named in the error, since its section would otherwise be dropped silently)."""
    out_dir = doc.get("LocalPath")
    if not out_dir:
        meant = [k for k in doc if _close_top_level_key(k) == "LocalPath"]
        raise MltraceValueError(
            f"{path}: LocalPath (the hook's out_dir) is missing"
            + (f" (the file has {meant[0]!r}: did you mean 'LocalPath'?)" if meant else
               ": add \"LocalPath\": \"/path/to/out_dir\""))
    if not isinstance(out_dir, str):
        raise MltraceValueError(f"{path}: LocalPath={out_dir!r} must be a string, the hook's out_dir")
    return out_dir


def _hook_kwargs(params: Mapping[str, Any], where: str,
                 save_defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """The hook constructor's arguments that HookParameters sets (only the keys it holds)."""
    kwargs: dict[str, Any] = {}
    for flag in ("save_all", "export_tensorboard", "dry_run", "strict"):
        if flag in params:
            kwargs[flag] = parse_flag(f"{where}.{flag}", params[flag])
    if "include_regex" in params:
        kwargs["include_regex"] = _split(params["include_regex"])
    if "include_workers" in params:
        kwargs["include_workers"] = str(params["include_workers"])
    if params.get("tensorboard_dir"):
        kwargs["tensorboard_dir"] = str(params["tensorboard_dir"])
    if "mlflow" in params:
        kwargs["mlflow"] = _mlflow_option(params["mlflow"], f"{where}.mlflow")
    save_config = _save_config_from([params], where, save_defaults)
    if save_config is not None:
        kwargs["save_config"] = save_config
    reduction_config = _reduction_config_from(params, where)
    if reduction_config is not None:
        kwargs["reduction_config"] = reduction_config
    return kwargs


def _mlflow_option(value: Any, where: str) -> bool | dict[str, Any]:
    """``mlflow``: true/false (also as strings), or the options object (also as a JSON string)."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise MltraceValueError(f"{where}={value!r} is not a JSON object: {exc}") from None
    return dict(value) if isinstance(value, Mapping) else parse_flag(where, value)


def _collection_settings(doc: Mapping[str, Any], params: Mapping[str, Any], path: str,
                         strict: bool, save_defaults: Mapping[str, Any] | None,
                         ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each CollectionConfigurations entry: its name and the settings to apply to it."""
    entries = doc.get("CollectionConfigurations") or []
    if not isinstance(entries, list):
        raise MltraceValueError(
            f"{path}: CollectionConfigurations must be a list of {{CollectionName, "
            f"CollectionParameters}} objects, got {entries!r}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not entry.get("CollectionName"):
            raise MltraceValueError(
                f"{path}: CollectionConfigurations[{i}] must be an object with CollectionName"
            )
        _check_keys(entry, COLLECTION_ENTRY_KEYS, f"{path} CollectionConfigurations[{i}]", strict)
        name = str(entry["CollectionName"])
        cparams = entry.get("CollectionParameters") or {}
        cwhere = f"{path} collection {name!r}"
        if not isinstance(cparams, Mapping):
            raise MltraceValueError(f"{cwhere}: CollectionParameters must be an object, got {cparams!r}")
        _check_keys(cparams, COLLECTION_KEYS, cwhere, strict)
        yield name, _one_collection(params, cparams, cwhere, save_defaults)


def _one_collection(params: Mapping[str, Any], cparams: Mapping[str, Any], where: str,
                    save_defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """One collection's settings from its CollectionParameters; its save keys inherit what they
    leave out from HookParameters, mode by mode, as smdebug's did."""
    settings: dict[str, Any] = {}
    if "include_regex" in cparams:
        settings["include_regex"] = _split(cparams["include_regex"])
    if "save_histogram" in cparams:
        settings["save_histogram"] = parse_flag(f"{where}.save_histogram", cparams["save_histogram"])
    if any(k.split(".")[-1] in _SAVE_KEYS for k in cparams):
        settings["save_config"] = _save_config_from([params, cparams], where, save_defaults)
    reduction = _reduction_config_from(cparams, where)
    if reduction is not None:
        settings["reduction_config"] = reduction
    return settings


def create_hook_from_config(cls: Any, json_file_path: str | None = None,
                            save_defaults: Mapping[str, Any] | None = None) -> Any:
    """Build hook class ``cls`` from the configuration file: constructor arguments first, then
    each configured collection's settings (every adapter's ``create_from_json_file``)."""
    return create_hook_from_parsed(cls, load_hook_config(json_file_path, save_defaults=save_defaults))


def create_hook_from_parsed(cls: Any, config: HookConfig) -> Any:
    """Build hook class ``cls`` from a parsed configuration (``mltrace run`` parses the document
    it hands to each process; ``create_hook_from_config`` parses a file)."""
    hook = cls(**config.hook_kwargs)
    for name, settings in config.collections.items():
        coll = hook.get_collection(name)
        for key, value in settings.items():
            if key == "include_regex":
                coll.include(value)
            else:
                setattr(coll, key, value)
    return hook


def load_hook_config(json_file_path: str | None = None,
                     save_defaults: Mapping[str, Any] | None = None) -> HookConfig:
    """Read and parse the hook configuration file (see config_file_path)."""
    path = config_file_path(json_file_path)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except ValueError as exc:
        raise MltraceValueError(f"hook configuration file {path!r} is not valid JSON: {exc}") from None
    return parse_hook_config(doc, path, save_defaults)
