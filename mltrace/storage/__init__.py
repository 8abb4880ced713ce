"""Storage backends behind one interface: ``open_storage(path_or_uri)``.

Schemes are a plain registry; ``file`` paths are built in. Other schemes (``s3://``) register
here when their backend is installed (mltrace.storage entry points are loaded on first use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mltrace.exceptions import MltraceValueError
from mltrace.storage.base import Storage
from mltrace.storage.local import LocalStorage

logger = logging.getLogger(__name__)

_SCHEMES: dict[str, Callable[[str], Storage]] = {}
_entry_points_loaded = False


def register_scheme(scheme: str, factory: Callable[[str], Storage]) -> None:
    """Make ``open_storage`` hand URIs of ``scheme://`` to ``factory``."""
    _SCHEMES[scheme] = factory


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="mltrace.storage"):
        try:
            register_scheme(ep.name, ep.load())
        except Exception as exc:  # a broken plugin must not break local use
            logger.warning("storage plugin %s could not be loaded: %s", ep.name, exc)


def open_storage(location: str) -> Storage:
    """Return the Storage for a local path or a ``scheme://`` URI.

    Raises:
        MltraceValueError: an empty location or a scheme no installed backend handles.
    """
    if not isinstance(location, str) or not location.strip():
        raise MltraceValueError(f"out_dir / trial path {location!r} must be a non-empty path or URI")
    location = location.strip()
    if "://" not in location:
        return LocalStorage(location)
    scheme = location.split("://", 1)[0].lower()
    if scheme == "file":
        return LocalStorage(location[len("file://"):])
    if scheme == "s3":
        from mltrace.storage.s3 import S3Storage  # boto3 is imported on first request

        return S3Storage(location)
    _load_entry_points()
    if scheme not in _SCHEMES:
        raise MltraceValueError(
            f"no storage backend for {location!r}: this mltrace handles local paths"
            + (f" and {', '.join(s + '://' for s in sorted(_SCHEMES))}" if _SCHEMES else "")
            + "; use a local directory"
        )
    return _SCHEMES[scheme](location)


__all__ = ["Storage", "LocalStorage", "open_storage", "register_scheme"]
