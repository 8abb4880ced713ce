"""The ``mltrace`` logger's level from MLTRACE_LOG_LEVEL (or smdebug's and Tornasole's variables).

Levels: DEBUG, INFO, WARNING, ERROR, CRITICAL, or OFF. Importing mltrace configures nothing: the
variables are applied when the application calls ``mltrace.configure_logging()``, or enters
mltrace through a hook or a command-line tool (a user who sets the variable asked for it). The
library never configures handlers beyond a stderr handler on the ``mltrace`` logger when the
variable is set.
"""

from __future__ import annotations

import logging
import os

LEVEL_ENV_VARS = ("MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL")
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "WARN": logging.WARNING, "ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL,
           "FATAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}


def configure_from_env() -> None:
    """Set the ``mltrace`` logger's level from the first of LEVEL_ENV_VARS that is set."""
    logger = logging.getLogger("mltrace")
    for var in LEVEL_ENV_VARS:
        raw = os.environ.get(var)
        if not raw:
            continue
        level = _LEVELS.get(raw.strip().upper())
        if level is None:
            logger.warning("%s=%r is not a log level; use one of %s", var, raw, ", ".join(_LEVELS))
            return
        logger.setLevel(level)
        logger.disabled = level > logging.CRITICAL
        if not logger.handlers and level <= logging.CRITICAL:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s"))
            logger.addHandler(handler)
        return
