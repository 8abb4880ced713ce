"""Training modes. Values and names are smdebug's: they are written into every record."""

from __future__ import annotations

from enum import Enum


class ModeKeys(Enum):
    """The phase a step belongs to; GLOBAL is the default and numbers every step of the run."""

    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4

    # Members are singletons compared by identity; Enum's own __hash__ is a Python function,
    # and the capture path looks modes up in dicts several times a step.
    __hash__ = object.__hash__


ALLOWED_MODES = [ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL]
ALLOWED_MODE_NAMES = [m.name for m in ALLOWED_MODES]
MODE_STEP_PLUGIN_NAME = "mode_step"
MODE_PLUGIN_NAME = "mode"


def mode_from(value: ModeKeys | str | int) -> ModeKeys:
    """Accept a ModeKeys, its name in any case ("train"), or its value (1) and return the ModeKeys.

    Raises:
        mltrace.exceptions.MltraceValueError: for anything else (a ValueError), naming the value
            and the allowed ones.
    """
    if isinstance(value, ModeKeys):
        return value
    if isinstance(value, str) and value.upper() in ModeKeys.__members__:
        return ModeKeys[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return ModeKeys(value)
        except ValueError:
            pass
    # Imported here: mltrace.exceptions imports this module.
    from mltrace.exceptions import MltraceValueError

    raise MltraceValueError(f"unknown mode {value!r}: use one of {ALLOWED_MODE_NAMES} (mltrace.modes)")


# smdebug users write `smd.modes.TRAIN`: the module itself stands for the enum there.
TRAIN = ModeKeys.TRAIN
EVAL = ModeKeys.EVAL
PREDICT = ModeKeys.PREDICT
GLOBAL = ModeKeys.GLOBAL
