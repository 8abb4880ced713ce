"""SaveConfig, SaveConfigMode and ReductionConfig: when to save, and what to save of a tensor.

They stay mutable after construction (smdebug's API reference disables a collection with
``hook.get_collection("metrics").save_config.end_step = 0``) and serialize to smdebug's JSON.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, overload

from mltrace.exceptions import MltraceAttributeError, MltraceValueError
from mltrace.modes import ALLOWED_MODES, ModeKeys, mode_from

DEFAULT_SAVE_INTERVAL = 500

@overload
def _as_int(name: str, value: Any, minimum: int | None = None, allow_none: Literal[False] = False) -> int: ...
@overload
def _as_int(name: str, value: Any, minimum: int | None = None, *, allow_none: bool) -> int | None: ...
def _as_int(name: str, value: Any, minimum: int | None = None, allow_none: bool = False) -> int | None:
    """Coerce ``value`` (an int or a decimal string, as smdebug's JSON allows) or raise clearly."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or value is None:
        raise MltraceValueError(f"{name}={value!r} must be an integer, e.g. {name}=100")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float("inf")
        raise MltraceValueError(f"{name}={value!r} must be an integer, e.g. {name}=100") from None
    if isinstance(value, float) and value != number:
        raise MltraceValueError(f"{name}={value!r} must be a whole number")
    if minimum is not None and number < minimum:
        raise MltraceValueError(f"{name}={value!r} must be >= {minimum}")
    return number


def _as_steps(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    # bytes and dicts are iterable, but their items are not the steps the user meant.
    if not isinstance(value, Iterable) or isinstance(value, (bytes, bytearray, Mapping)):
        raise MltraceValueError(f"save_steps={value!r} must be a list of steps, e.g. [0, 10, 20]")
    return sorted({int(_as_int("save_steps entry", v, minimum=0)) for v in value})


def name_list(what: str, value: Any, kind: str = "tensor name", example: str = "loss") -> list[str]:
    """One name or a list of names as a list, each a non-empty str (a bare string is one name,
    not a list of its characters); None is no name. Shared by every argument that takes names
    (``when_nan``, ``include_collections``, ``collections_to_write``).

    Raises:
        mltrace.exceptions.MltraceValueError: naming ``what``, the bad value and an example.
    """
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable) or isinstance(value, (bytes, bytearray, Mapping)):
        raise MltraceValueError(
            f"{what}={value!r} must be a {kind} or a list of them, e.g. {what}=[{example!r}]")
    names = list(value)
    for item in names:
        if not isinstance(item, str) or not item:
            raise MltraceValueError(
                f"{what} entry {item!r} must be a non-empty {kind}, e.g. {what}=[{example!r}]")
    return names


def _reject_unknown_attribute(obj: object, name: str, allowed: Iterable[str]) -> None:
    """Setting a misspelt field (``save_intervl``) would be silently ignored: raise instead."""
    if not name.startswith("_") and name not in allowed:
        raise MltraceAttributeError(
            f"{type(obj).__name__} has no setting {name!r}: use one of {', '.join(sorted(allowed))}")


class SaveConfigMode:
    """When to save in one mode: every ``save_interval`` mode steps in [start_step, end_step),
    plus every step of ``save_steps``, plus (mltrace) steps where a ``when_nan`` tensor holds NaN.

    A step is saved if ``step in save_steps`` or ``start_step <= step < end_step and
    step % save_interval == 0`` (the modulo is on the step itself, as smdebug).

    Example:
        >>> SaveConfigMode(save_interval=100, end_step=201).should_save_step(200)
        True
    """

    def __init__(self, save_interval: int | str | None = None, start_step: int | str | None = None,
                 end_step: int | str | None = None, save_steps: Iterable[int] | str | None = None,
                 when_nan: Iterable[str] | None = None) -> None:
        self.save_interval = DEFAULT_SAVE_INTERVAL if save_interval is None else save_interval
        self._end_step: int | None = None
        self.start_step = 0 if start_step is None else start_step
        self.end_step = end_step
        self.save_steps = save_steps
        self.when_nan = when_nan

    SETTINGS = ("save_interval", "start_step", "end_step", "save_steps", "when_nan")  # __init__'s order

    def __setattr__(self, name: str, value: Any) -> None:
        _reject_unknown_attribute(self, name, self.SETTINGS)
        object.__setattr__(self, name, value)

    @property
    def when_nan(self) -> list[str]:
        """Tensor names: also save every step where one of them holds NaN."""
        return self._when_nan

    @when_nan.setter
    def when_nan(self, value: Iterable[str] | str | None) -> None:
        self._when_nan = name_list("when_nan", value)

    # Validated setters keep the object mutable and always consistent.
    @property
    def save_interval(self) -> int:
        """Save every this many mode steps (>= 1)."""
        return self._save_interval

    @save_interval.setter
    def save_interval(self, value: int | str) -> None:
        self._save_interval = _as_int("save_interval", value, minimum=1)

    @property
    def start_step(self) -> int:
        """First mode step the interval applies to."""
        return self._start_step

    @start_step.setter
    def start_step(self, value: int | str) -> None:
        start = _as_int("start_step", value, minimum=0)
        self._check_range(start, getattr(self, "_end_step", None))
        self._start_step = start

    @property
    def end_step(self) -> int | None:
        """Mode step (exclusive) where the interval stops; None for never. 0 disables saving."""
        return self._end_step

    @end_step.setter
    def end_step(self, value: int | str | None) -> None:
        end = _as_int("end_step", value, minimum=0, allow_none=True)
        self._check_range(getattr(self, "_start_step", 0), end)
        self._end_step = end

    @property
    def save_steps(self) -> list[int]:
        """Extra mode steps to save, whatever the interval says."""
        return self._save_steps

    @save_steps.setter
    def save_steps(self, value: Iterable[int] | str | None) -> None:
        self._save_steps = _as_steps(value)
        self._save_steps_set = frozenset(self._save_steps)

    @staticmethod
    def _check_range(start: int | None, end: int | None) -> None:
        # end_step=0 is how smdebug users switch a collection off, whatever its start_step.
        # end_step == start_step would be an empty range: a silent "off" that is more likely a
        # mistake than a choice, so it is rejected too (end_step=0 says "off" on purpose).
        if end is not None and end != 0 and start is not None and end <= start:
            where = "before" if end < start else "equal to"
            raise MltraceValueError(
                f"end_step={end} is {where} start_step={start}: end_step is exclusive, so nothing "
                f"would be saved; use end_step > start_step, e.g. end_step={start + 1}, or "
                "end_step=0 to switch saving off")

    def should_save_step(self, step: int) -> bool:
        """True if mode step ``step`` is due (when_nan steps are decided by the hook)."""
        if step in self._save_steps_set:
            return True
        if step < self._start_step or (self._end_step is not None and step >= self._end_step):
            return False
        return step % self._save_interval == 0

    def next_save_step(self, step: int) -> int | None:
        """The first mode step at or after ``step`` that is due, or None if none ever is."""
        extra = next((s for s in self._save_steps if s >= step), None)  # sorted
        start = max(step, self._start_step)
        due = -(-start // self._save_interval) * self._save_interval  # the interval's next multiple
        if self._end_step is not None and due >= self._end_step:
            return extra
        return due if extra is None else min(due, extra)

    def to_json_dict(self) -> dict[str, Any]:
        """smdebug's dict form; ``when_nan`` is added only when set (smdebug ignores it)."""
        out: dict[str, Any] = {"save_interval": self.save_interval, "save_steps": list(self.save_steps),
                               "start_step": self.start_step, "end_step": self.end_step}
        if self.when_nan:
            out["when_nan"] = list(self.when_nan)
        return out

    @overload
    @classmethod
    def from_dict(cls, params: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> SaveConfigMode: ...
    @overload
    @classmethod
    def from_dict(cls, params: None, defaults: Mapping[str, Any] | None = None) -> None: ...
    @overload
    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None) -> SaveConfigMode | None: ...
    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None) -> SaveConfigMode | None:
        """Build from smdebug's dict form; missing keys come from ``defaults``."""
        if params is None:
            return None
        if not isinstance(params, Mapping):
            raise MltraceValueError(f"a save config must be a dict, got {params!r}")
        defaults = defaults or {}
        unknown = set(params) - set(cls.SETTINGS)
        if unknown:
            raise MltraceValueError(f"unknown save config keys {sorted(unknown)}: allowed are "
                                    f"{', '.join(cls.SETTINGS)}")
        return cls(*(params.get(k, defaults.get(k)) for k in cls.SETTINGS))

    def copy(self) -> SaveConfigMode:
        """An independent copy."""
        return SaveConfigMode(self.save_interval, self.start_step, self.end_step,
                              list(self.save_steps), list(self.when_nan))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SaveConfigMode) and self.to_json_dict() == other.to_json_dict()

    def __repr__(self) -> str:
        return (f"SaveConfigMode(save_interval={self.save_interval}, start_step={self.start_step}, "
                f"end_step={self.end_step}, save_steps={self.save_steps})")


class SaveConfig:
    """Per-mode SaveConfigModes. The simple form sets the same rule for every mode.

    Args:
        mode_save_configs: advanced form, {mode: SaveConfigMode or dict}; modes left out get the
            simple-form values (or the defaults).
        save_interval, start_step, end_step, save_steps: the simple form (see SaveConfigMode).
        when_nan: tensor names; also save at every step where one of them holds NaN (Tornasole).

    Setting ``save_interval``, ``start_step``, ``end_step`` or ``save_steps`` on a SaveConfig
    sets it for every mode.
    """

    #: the settings a SaveConfig sets (and reads) on every mode at once
    _FIELDS = SaveConfigMode.SETTINGS

    def __init__(
        self,
        mode_save_configs: Mapping[ModeKeys | str, SaveConfigMode | Mapping[str, Any]] | None = None,
        save_interval: int | str | None = None,
        start_step: int | str | None = None,
        end_step: int | str | None = None,
        save_steps: Iterable[int] | str | None = None,
        when_nan: Iterable[str] | None = None,
    ) -> None:
        base = SaveConfigMode(save_interval, start_step, end_step, save_steps, when_nan)
        modes: dict[ModeKeys, SaveConfigMode] = {m: base.copy() for m in ALLOWED_MODES}
        if mode_save_configs is not None and not isinstance(mode_save_configs, Mapping):
            raise MltraceValueError(
                f"mode_save_configs={mode_save_configs!r} must be a dict {{mode: SaveConfigMode}}, "
                "e.g. {modes.TRAIN: SaveConfigMode(save_interval=10)}")
        for mode, cfg in (mode_save_configs or {}).items():
            if mode in SaveConfigMode.SETTINGS:
                # {"save_interval": 10} is one mode's settings, not a dict of modes.
                raise MltraceValueError(
                    f"save config {dict(mode_save_configs)!r} has the setting {mode!r} where a mode "  # type: ignore[arg-type]
                    f"belongs: use SaveConfig({mode}=...) for every mode, or "
                    f"{{'TRAIN': {{{mode!r}: ...}}}} for one")
            mode = mode_from(mode)
            if isinstance(cfg, Mapping):
                try:
                    cfg = SaveConfigMode.from_dict(cfg, base.to_json_dict())
                except MltraceValueError as exc:
                    raise MltraceValueError(f"save config of mode {mode.name}: {exc}") from None
            if not isinstance(cfg, SaveConfigMode):
                raise MltraceValueError(
                    f"mode_save_configs[{mode.name}]={cfg!r} must be a SaveConfigMode or a dict")
            if when_nan and not cfg.when_nan:
                cfg.when_nan = when_nan
            modes[mode] = cfg
        object.__setattr__(self, "mode_save_configs", modes)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._FIELDS:
            # Validate once before changing any mode, so a bad value leaves every mode as it was.
            for cfg in self.mode_save_configs.values():
                setattr(cfg.copy(), name, value)
            for cfg in self.mode_save_configs.values():
                setattr(cfg, name, value)
            return
        _reject_unknown_attribute(self, name, (*self._FIELDS, "mode_save_configs"))
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally: the per-mode fields.
        if name in self._FIELDS:
            modes = self.__dict__["mode_save_configs"]
            values = [getattr(c, name) for c in modes.values()]
            return values[0] if all(v == values[0] for v in values) else {
                m.name: v for m, v in zip(modes, values)}
        raise AttributeError(name)

    def get_save_config(self, mode: ModeKeys | str) -> SaveConfigMode:
        """The SaveConfigMode of ``mode``."""
        return self.mode_save_configs[mode_from(mode)]

    def set_save_config(self, mode: ModeKeys | str, save_config_mode: SaveConfigMode) -> None:
        """Replace the rule of one mode."""
        self.mode_save_configs[mode_from(mode)] = save_config_mode

    def should_save_step(self, mode: ModeKeys, step: int) -> bool:
        """True if mode step ``step`` of ``mode`` is due."""
        return self.mode_save_configs[mode].should_save_step(step)

    def watched_nan_tensors(self) -> set[str]:
        """Every tensor name some mode watches for NaN."""
        return {t for c in self.mode_save_configs.values() for t in c.when_nan}

    def copy(self) -> SaveConfig:
        """An independent deep copy."""
        return SaveConfig({m: c.copy() for m, c in self.mode_save_configs.items()})

    def to_json_dict(self) -> dict[str, dict[str, Any]]:
        """{"TRAIN": {...}, "EVAL": {...}, "PREDICT": {...}, "GLOBAL": {...}} as smdebug writes."""
        return {m.name: c.to_json_dict() for m, c in self.mode_save_configs.items()}

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None) -> SaveConfig | None:
        """Parse smdebug's JSON form ({mode name: SaveConfigMode dict or null})."""
        if params is None:
            return None
        if not isinstance(params, Mapping):
            raise MltraceValueError(f"save_config must be a dict of modes, got {params!r}")
        configs = {mode_from(k): SaveConfigMode.from_dict(v) for k, v in params.items() if v is not None}
        return cls(mode_save_configs=configs)  # type: ignore[arg-type]

    def to_json(self) -> str:
        """smdebug's ``to_json``: ``to_json_dict()`` as JSON text (smdebug's SaveConfig.from_json
        reads it; ``when_nan``, mltrace's, is there only when set)."""
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json(cls, json_str: str | bytes) -> SaveConfig:
        """smdebug's ``from_json``: the inverse of ``to_json`` (reads smdebug's JSON too).

        Raises:
            MltraceValueError: not JSON, or not a save config.
        """
        config = cls.from_dict(_json_object("SaveConfig", json_str))
        assert config is not None  # from_dict returns None for None only
        return config

    @classmethod
    def parse(cls, obj: Any) -> SaveConfig:
        """Accept None, a SaveConfig, a SaveConfigMode, or a {mode: SaveConfigMode} dict."""
        if obj is None:
            return cls()
        if isinstance(obj, SaveConfig):
            return obj
        if isinstance(obj, SaveConfigMode):
            return cls({m: obj.copy() for m in ALLOWED_MODES})
        if isinstance(obj, Mapping):
            return cls(mode_save_configs=obj)
        raise MltraceValueError(
            f"save_config={obj!r} must be a SaveConfig, a SaveConfigMode or a dict {{mode: SaveConfigMode}}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SaveConfig) and self.to_json_dict() == other.to_json_dict()

    def __repr__(self) -> str:
        return f"SaveConfig({ {m.name: c for m, c in self.mode_save_configs.items()} })"


# Reductions smdebug 1.0.34 knows (it rejects other tokens in its JSON) and mltrace's additions,
# which go into the collection entry's extra key "mltrace_reductions" instead.
SMDEBUG_REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "prod")
SMDEBUG_NORMS = ("l1", "l2")
EXTRA_REDUCTIONS = ("median", "nan_count", "inf_count", "zero_fraction")
ALL_REDUCTIONS = SMDEBUG_REDUCTIONS + SMDEBUG_NORMS + EXTRA_REDUCTIONS
#: The JSON key that carries mltrace's own reductions beside smdebug's ``reductions`` string.
EXTRA_REDUCTIONS_KEY = "mltrace_reductions"


def _check_names(kind: str, names: Iterable[str], allowed: Sequence[str], field: str = "") -> list[str]:
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    if not isinstance(names, Iterable) or isinstance(names, (bytes, bytearray, Mapping)):
        raise MltraceValueError(
            f"{field or kind}={names!r} must be a list of names, e.g. [{', '.join(map(repr, allowed[:2]))}]")
    out = []
    for name in names:
        name = str(name).strip()
        if name not in allowed:
            raise MltraceValueError(f"unknown {kind} {name!r}{_did_you_mean(name, allowed)}: "
                                    f"choose from {', '.join(allowed)}")
        if name not in out:
            out.append(name)
    return out


def _did_you_mean(name: str, allowed: Sequence[str]) -> str:
    """`` (did you mean 'mean'?)`` for the allowed name closest to a misspelt one, else ''."""
    close = [a for a in allowed if a.lower() == name.lower()] or difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class ReductionConfig:
    """Which reductions of a tensor to save, and whether to save the tensor itself and its shape.

    Args:
        reductions: min, max, mean, std, variance, sum, prod; plus mltrace's median, nan_count,
            inf_count, zero_fraction (NaN/Inf visibility without the raw tensor).
        abs_reductions: the same, over the absolute value.
        norms: l1, l2 (over the flattened tensor).
        abs_norms: l1, l2 over the absolute value (equal to norms; kept for smdebug).
        save_raw_tensor: also save the full tensor.
        save_shape: record the tensor's shape in the index.

    Example:
        >>> ReductionConfig(reductions=["min", "max"], norms=["l2"], save_raw_tensor=True)
    """

    def __init__(
        self,
        reductions: Iterable[str] | None = None,
        abs_reductions: Iterable[str] | None = None,
        norms: Iterable[str] | None = None,
        abs_norms: Iterable[str] | None = None,
        save_raw_tensor: bool = False,
        save_shape: bool = False,
    ) -> None:
        # each assignment is checked again by __setattr__ (which returns the same list)
        self.reductions = self._names("reductions", reductions)
        self.abs_reductions = self._names("abs_reductions", abs_reductions)
        self.norms = self._names("norms", norms)
        self.abs_norms = self._names("abs_norms", abs_norms)
        self.save_raw_tensor = save_raw_tensor
        self.save_shape = save_shape

    # field -> (what the error calls it, the names allowed)
    _LISTS: dict[str, tuple[str, tuple[str, ...]]] = {
        "reductions": ("reduction", SMDEBUG_REDUCTIONS + EXTRA_REDUCTIONS),
        "abs_reductions": ("abs reduction", SMDEBUG_REDUCTIONS + ("median",)),
        "norms": ("norm", SMDEBUG_NORMS),
        "abs_norms": ("abs norm", SMDEBUG_NORMS),
    }
    _FLAGS = ("save_raw_tensor", "save_shape")

    reductions: list[str]
    abs_reductions: list[str]
    norms: list[str]
    abs_norms: list[str]
    save_raw_tensor: bool
    save_shape: bool

    @classmethod
    def _names(cls, field: str, value: Iterable[str] | None) -> list[str]:
        kind, allowed = cls._LISTS[field]
        return _check_names(kind, [] if value is None else value, allowed, field)

    def __setattr__(self, name: str, value: Any) -> None:
        # Attributes stay plain and public, as smdebug's, but every assignment is checked.
        if name in self._LISTS:
            value = self._names(name, value)
        elif name in self._FLAGS:
            if not isinstance(value, bool):
                raise MltraceValueError(f"{name}={value!r} must be True or False")
        else:
            _reject_unknown_attribute(self, name, (*self._LISTS, *self._FLAGS))
        object.__setattr__(self, name, value)

    def validate(self) -> None:
        """Check the lists again: they can be changed in place (``config.reductions.append(...)``),
        which no assignment sees. Hooks call this before their first step.

        Raises:
            MltraceValueError: an unknown reduction or norm, named with the valid ones.
        """
        for name in self._LISTS:
            setattr(self, name, getattr(self, name))

    def items(self) -> list[tuple[str, bool]]:
        """Every (reduction name, abs) pair to compute, norms included, in smdebug's order."""
        return ([(r, False) for r in self.reductions + self.norms]
                + [(r, True) for r in self.abs_reductions + self.abs_norms])

    def _tokens(self, extra: bool) -> list[str]:
        """The JSON tokens of smdebug's reductions and norms, or (``extra``) of mltrace's own."""
        if extra:
            return ([r for r in self.reductions if r in EXTRA_REDUCTIONS]
                    + [f"abs_{r}" for r in self.abs_reductions if r in EXTRA_REDUCTIONS])
        return ([r for r in self.reductions if r not in EXTRA_REDUCTIONS]
                + [f"{n}_norm" for n in self.norms]
                + [f"abs_{r}" for r in self.abs_reductions if r not in EXTRA_REDUCTIONS]
                + [f"abs_{n}_norm" for n in self.abs_norms])

    def to_json_dict(self) -> dict[str, Any]:
        """smdebug's form: only the reductions smdebug knows are in ``reductions``."""
        return {"save_raw_tensor": self.save_raw_tensor, "reductions": ",".join(self._tokens(extra=False)),
                "save_shape": self.save_shape}

    def extra_reductions_string(self) -> str:
        """mltrace's own reductions as a token string ('' if none), for the extra JSON key."""
        return ",".join(self._tokens(extra=True))

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None, extra: str | None = None) -> ReductionConfig | None:
        """Parse smdebug's flat form: ``{"reductions": "min,abs_l2_norm", "save_raw_tensor": ...}``.

        Tokens: ``<red>``, ``abs_<red>``, ``<norm>_norm``, ``abs_<norm>_norm``, and the bare
        ``l1``/``l2``/``abs_l1``/``abs_l2`` the smdebug docs show. ``extra`` adds tokens from
        mltrace's extra key.
        """
        if params is None:
            return None
        if not isinstance(params, Mapping):
            raise MltraceValueError(f"reduction_config must be a dict, got {params!r}")
        tokens = str(params.get("reductions") or "") + "," + (extra or "")
        found: dict[str, list[str]] = {field: [] for field in cls._LISTS}
        for token in filter(None, (t.strip() for t in tokens.split(","))):
            base = token.removeprefix("abs_")
            prefix = token[:len(token) - len(base)]  # "abs_" or ""
            if base.endswith("_norm") and base[:-5] in SMDEBUG_NORMS:
                base = base[:-5]
            if base not in ALL_REDUCTIONS:
                valid = list(SMDEBUG_REDUCTIONS + EXTRA_REDUCTIONS) + ["l1_norm", "l2_norm"]
                raise MltraceValueError(f"unknown reduction {token!r}{_did_you_mean(base, valid)}: use "
                                        f"{', '.join(valid)} (any of them prefixed abs_)")
            found[prefix + ("norms" if base in SMDEBUG_NORMS else "reductions")].append(base)
        return cls(found["reductions"], found["abs_reductions"], found["norms"], found["abs_norms"],
                   _flag("save_raw_tensor", params.get("save_raw_tensor", False)),
                   _flag("save_shape", params.get("save_shape", False)))

    def to_json(self) -> str:
        """smdebug's ``to_json``: ``to_json_dict()`` as JSON text, plus mltrace's own reductions
        under ``mltrace_reductions`` when there are any (smdebug's from_json ignores that key)."""
        out = self.to_json_dict()
        if extra := self.extra_reductions_string():
            out[EXTRA_REDUCTIONS_KEY] = extra
        return json.dumps(out)

    @classmethod
    def from_json(cls, json_str: str | bytes) -> ReductionConfig:
        """smdebug's ``from_json``: the inverse of ``to_json`` (reads smdebug's JSON too).

        Raises:
            MltraceValueError: not JSON, not a reduction config, or an unknown reduction.
        """
        params = _json_object("ReductionConfig", json_str)
        config = cls.from_dict(params, params.get(EXTRA_REDUCTIONS_KEY))
        assert config is not None  # params is a dict
        return config

    def copy(self) -> ReductionConfig:
        """An independent copy."""
        return ReductionConfig(self.reductions, self.abs_reductions, self.norms, self.abs_norms,
                               self.save_raw_tensor, self.save_shape)

    def __eq__(self, other: object) -> bool:
        # Order-blind: every listed reduction is computed, whatever the order (and to_json
        # writes smdebug's reductions before mltrace's own).
        return isinstance(other, ReductionConfig) and (
            set(self.items()), self.save_raw_tensor, self.save_shape
        ) == (set(other.items()), other.save_raw_tensor, other.save_shape)

    def __repr__(self) -> str:
        return (f"ReductionConfig(reductions={self.reductions}, abs_reductions={self.abs_reductions}, "
                f"norms={self.norms}, abs_norms={self.abs_norms}, "
                f"save_raw_tensor={self.save_raw_tensor}, save_shape={self.save_shape})")


def _json_object(what: str, json_str: str | bytes) -> dict[str, Any]:
    """Parse ``json_str`` for ``<what>.from_json``: a JSON object, or a clear error."""
    try:
        value = json.loads(json_str)
    except (TypeError, ValueError) as exc:
        raise MltraceValueError(f"{what}.from_json: not JSON text ({exc}): pass the string "
                                f"{what}.to_json() returned") from None
    if not isinstance(value, dict):
        raise MltraceValueError(f"{what}.from_json: {json_str!r} is not a JSON object, the "
                                f"form {what}.to_json() returns")
    return value


def _flag(name: str, value: Any) -> bool:
    """JSON configs carry booleans as JSON booleans or as "true"/"false" strings (SageMaker)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise MltraceValueError(f"{name}={value!r} must be true or false")


parse_flag = _flag
