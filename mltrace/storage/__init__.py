"""Storage backends behind one interface: ``open_storage(path_or_uri)``.

Local paths (and ``file://``) are LocalStorage. Other URI schemes come from the ``mltrace.storage``
registry of mltrace.plugins: ``s3`` is registered here (boto3 is imported on first use), other
packages add schemes through ``mltrace.storage`` entry points (loaded the first time a scheme is
not registered), and ``register_scheme`` adds one at run time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mltrace import plugins
from mltrace.exceptions import MltraceValueError
from mltrace.storage.base import Storage
from mltrace.storage.local import LocalStorage

logger = logging.getLogger(__name__)


def register_scheme(scheme: str, factory: Callable[[str], Storage]) -> None:
    """Make ``open_storage`` hand URIs of ``scheme://`` to ``factory``.

    Args:
        scheme: the URI scheme, e.g. ``"gs"`` (matched case-insensitively).
        factory: called with the whole URI; returns a Storage.
    """
    plugins.storage.register(scheme.lower(), factory)


def _s3(location: str) -> Storage:
    from mltrace.storage.s3 import S3Storage  # boto3 is imported on first request

    return S3Storage(location)


register_scheme("s3", _s3)


def is_remote(location: str) -> bool:
    """True if ``location`` is a URI of a remote store (``s3://``, ...), not a local path or a
    ``file://`` URI."""
    return "://" in location and not location.lower().startswith("file://")


def open_storage(location: str) -> Storage:
    """Return the Storage for a local path or a ``scheme://`` URI.

    Raises:
        MltraceValueError: an empty location or a scheme no installed backend handles.
    """
    if not isinstance(location, str) or not location.strip():
        raise MltraceValueError(
            f"out_dir / trial path {location!r} must be a non-empty path or URI")
    location = location.strip()
    if "://" not in location:
        return LocalStorage(location)
    scheme = location.split("://", 1)[0].lower()
    if scheme == "file":
        return LocalStorage(location[len("file://"):])
    factory = plugins.storage.get(scheme)
    if factory is None:
        schemes = ["file://", *(f"{s}://" for s in plugins.storage.names())]
        failed = plugins.storage.failures.get(scheme)
        raise MltraceValueError(
            f"no storage backend for {location!r}"
            + (f" (its plugin failed to load: {failed})" if failed else "")
            + f": this mltrace handles local paths and {', '.join(schemes)}; use a local directory"
        )
    return factory(location)


__all__ = ["Storage", "LocalStorage", "open_storage", "register_scheme"]
