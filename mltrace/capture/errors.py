"""The error policy of the training path: mltrace never crashes a user's training by its own bug.

Every entry point that a training loop calls (a framework callback, ``save_scalar``, ...) is
wrapped with :func:`guarded`. An exception that escapes it is either the user's to fix, and
raised (a bad argument to a user-facing method, a collection that matches nothing, a rule's
request to stop), or mltrace's own failure: then it is logged once, the hook stops saving for the
rest of the run, and training goes on. ``strict=True`` raises everything instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from mltrace.exceptions import InvalidCollectionConfiguration, MltraceError, StopTrainingRequested

logger = logging.getLogger("mltrace.capture.hook")
F = TypeVar("F", bound=Callable[..., Any])

#: Raised to the user whatever the method: their configuration, or a rule's stop request.
ALWAYS_RAISED: tuple[type[BaseException], ...] = (InvalidCollectionConfiguration, StopTrainingRequested)


class ErrorPolicy:
    """Whether the hook still saves, and what an exception in the training path does.

    Args:
        strict: raise every exception instead of disabling the hook.
        on_disable: called once, with the reason, when the hook disables itself (closes files).
    """

    def __init__(self, strict: bool, on_disable: Callable[[str], None]) -> None:
        self.strict = strict
        self.disabled = False
        self._on_disable = on_disable

    def must_raise(self, exc: BaseException, user_facing: bool) -> bool:
        """True if ``exc`` goes to the caller rather than disabling the hook."""
        return self.strict or isinstance(exc, ALWAYS_RAISED) or (user_facing and isinstance(exc, MltraceError))

    def failed(self, exc: Exception, where: str, user_facing: bool = False) -> None:
        """What an exception escaping ``where`` does: raised again if it goes to the caller
        (see must_raise), else it disables the hook."""
        if self.must_raise(exc, user_facing):
            raise exc
        self.disable(f"{where}: {type(exc).__name__}: {exc}")

    def disable(self, reason: str) -> None:
        """Stop saving for the rest of the run (training goes on; what was written stays)."""
        if self.disabled:
            return
        logger.error(
            "mltrace hit an internal error and stops saving for the rest of this run (training "
            "goes on; data already written stays readable): %s. Pass strict=True to raise instead.",
            reason,
        )
        self.disabled = True
        try:
            self._on_disable(reason)
        except Exception:  # noqa: BLE001 - closing after an internal error is best effort
            logger.debug("closing after an internal error failed", exc_info=True)


class HasErrorPolicy(Protocol):
    """Anything whose methods :func:`guarded` wraps: it carries the policy in force."""

    errors: ErrorPolicy


def guarded(default: Any = None, *, user_facing: bool = False) -> Callable[[F], F]:
    """Wrap a method called from the user's training loop by the owner's ``errors`` policy.

    Args:
        default: what the method returns when the hook is disabled or has just disabled itself.
        user_facing: the method takes the user's arguments, so an MltraceError raised in it
            (a bad name or value) is the user's to fix and is raised, not swallowed.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: HasErrorPolicy, *args: Any, **kwargs: Any) -> Any:
            policy = self.errors
            if policy.disabled:
                return default
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                policy.failed(exc, fn.__qualname__, user_facing)
                return default

        return wrapper  # type: ignore[return-value]

    return decorate
