"""One process of a job run by ``mltrace run``: its configuration and the hooks it created.

Each framework attachment (mltrace.launch.attach_*) asks the session for a hook when the script
first trains; the session builds it from the run's configuration, or answers None when the script
has created a hook of its own (it keeps its own: no second hook) or when the configuration cannot
be used. Errors of the attachment itself are logged once and turn it off: mltrace never stops the
user's training because of its own bug.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mltrace.capture import hook as core_hook
from mltrace.capture.json_config import create_hook_from_parsed, parse_hook_config
from mltrace.exceptions import StopTrainingRequested
from mltrace.launch.config import RUN_CONFIG_ENV

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class Session:
    """The run's configuration (smdebug's JSON document) and the hooks made from it here."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = dict(doc)
        self.hooks: list[Any] = []  # the hooks this session created (framework objects)
        self._cores: set[int] = set()  # their core hooks (what mltrace.capture.hook.get_hook returns)
        self.off: set[str] = set()  # frameworks whose attachment is turned off

    def script_has_own_hook(self) -> bool:
        """True when the last hook created in this process is not one of this session's."""
        current = core_hook.get_hook()
        return current is not None and id(current) not in self._cores

    def create_hook(self, cls: Any, framework: str,
                    save_defaults: Mapping[str, Any] | None = None) -> Any | None:
        """A hook of class ``cls`` from the configuration, or None (the script has its own hook:
        the framework's attachment stays off from then on)."""
        if framework in self.off:
            return None
        if self.script_has_own_hook():
            logger.info("mltrace run: the script created its own hook; %s attaches none", framework)
            self.off.add(framework)
            return None
        config = parse_hook_config(self.doc, RUN_CONFIG_ENV, save_defaults)
        hook = create_hook_from_parsed(cls, config)
        self.hooks.append(hook)
        self._cores.add(id(getattr(hook, "core", hook)))
        logger.info("mltrace run: %s hook writing to %s", framework, config.hook_kwargs["out_dir"])
        return hook

    def fail(self, framework: str, exc: BaseException) -> None:
        """Turn ``framework``'s attachment off after an internal error, saying so once."""
        if framework not in self.off:
            self.off.add(framework)
            logger.error("mltrace run: attaching to %s failed (%s: %s); training goes on without "
                         "mltrace for %s", framework, type(exc).__name__, exc, framework,
                         exc_info=logger.isEnabledFor(logging.DEBUG))


def guarded(session: Session, framework: str) -> Callable[[F], F]:
    """Decorator for the attachment's callbacks: an error turns the attachment off and returns
    None, except StopTrainingRequested (a rule asked the user's loop to end)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if framework in session.off:
                return None
            try:
                return fn(*args, **kwargs)
            except StopTrainingRequested:
                raise
            except Exception as exc:  # noqa: BLE001 - mltrace's bug must not end the training
                session.fail(framework, exc)
                return None

        return call  # type: ignore[return-value]

    return wrap
