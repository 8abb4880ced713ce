"""The start of every Python process of a job run by ``mltrace run``.

``mltrace run`` puts mltrace/launch/bootstrap on PYTHONPATH; the ``sitecustomize`` there calls
:func:`activate` as the interpreter starts, in the script's process and in each process it
starts (torchrun workers, multiprocessing's spawned children), since they inherit the
environment. Nothing is imported or created until the script imports a framework: then that
framework's attachment is installed, and the hook itself is created when the script first
trains. Forked children inherit the attachments as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from mltrace.launch.imports import when_imported

logger = logging.getLogger(__name__)

#: module whose import installs an attachment -> the mltrace.launch module that attaches
ATTACHMENTS = {
    "torch": "mltrace.launch.attach_torch",
    "keras": "mltrace.launch.attach_keras",
    "tensorflow": "mltrace.launch.attach_tf_session",
    "xgboost": "mltrace.launch.attach_xgboost",
    "mxnet": "mltrace.launch.attach_mxnet",
}

_attached: dict[str, Any] = {}


def activate() -> bool:
    """Install the post-import attachments if this process belongs to an ``mltrace run`` job
    (its configuration is in the environment); True if it does. Never raises: a configuration
    that cannot be read is logged and the script runs without mltrace."""
    from mltrace._logging import configure_from_env
    from mltrace.launch.config import run_config_from_environment
    from mltrace.launch.session import Session

    try:
        configure_from_env()
        doc = run_config_from_environment()
    except Exception as exc:  # noqa: BLE001 - the script must run whatever our configuration is
        logger.error("mltrace run: cannot read the hook configuration (%s); the script runs "
                     "without mltrace", exc)
        return False
    if doc is None:
        return False
    session = Session(doc)
    for module_name, attachment in ATTACHMENTS.items():
        when_imported(module_name, _attacher(session, module_name, attachment))
    return True


def _attacher(session: Any, framework: str, attachment: str) -> Callable[[ModuleType], None]:
    def attach(module: ModuleType) -> None:
        import importlib

        try:
            _attached[framework] = importlib.import_module(attachment).attach(session, module)
        except Exception as exc:  # noqa: BLE001 - never fail the script's import
            session.fail(framework, exc)

    return attach


def attachment(framework: str) -> Any | None:
    """The attachment installed in this process for ``framework`` (tests, debugging)."""
    return _attached.get(framework)
