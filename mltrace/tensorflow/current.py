"""``get_hook`` for TensorFlow: the current KerasHook or SessionHook, or one built from smdebug's
JSON configuration. A module above the front doors, which it returns."""

from __future__ import annotations

from typing import Any, cast

from mltrace.capture.hook import Hook, hook_of_class
from mltrace.exceptions import MltraceValueError
from mltrace.tensorflow._api import TFHookAPI
from mltrace.tensorflow._core import TFAdapter
from mltrace.tensorflow.keras import KerasHook
from mltrace.tensorflow.session import SessionHook


def get_hook(hook_type: str | None = None, json_config_path: str | None = None,
             create_if_not_exists: bool = False) -> TFHookAPI | None:
    """The current TensorFlow hook (smdebug's ``get_hook``): the KerasHook or SessionHook
    created last or given to ``set_hook``, if it is of ``hook_type`` ("keras", "session",
    "estimator"; None: any). Else, with ``create_if_not_exists``, a ``hook_type`` hook built from
    the JSON configuration (``json_config_path``, else ``MLTRACE_CONFIG_FILE_PATH`` /
    ``SMDEBUG_CONFIG_FILE_PATH``), or None if there is none.

    Raises:
        MltraceValueError: an unknown ``hook_type``, or ``create_if_not_exists`` without one.
    """
    hook_types: dict[str, type[TFHookAPI]] = {"keras": KerasHook, "session": SessionHook,
                                              "estimator": SessionHook}
    if hook_type is not None and hook_type not in hook_types:
        raise MltraceValueError(f"get_hook(hook_type={hook_type!r}): use one of {sorted(hook_types)} or None")
    if hook_type is None and create_if_not_exists:
        raise MltraceValueError("get_hook(create_if_not_exists=True) needs the hook_type to create: "
                                "'keras', 'session' or 'estimator'")
    hook_class = hook_types[hook_type] if hook_type is not None else TFHookAPI

    def front(core: Hook) -> Any:
        return core.adapter.owner if isinstance(core.adapter, TFAdapter) else None

    return cast("TFHookAPI | None", hook_of_class(hook_class, front, json_config_path, create_if_not_exists))


__all__ = ["get_hook"]
