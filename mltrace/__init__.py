"""mltrace: save the tensors of a training run in smdebug's format, and analyse them.

Public names only; frameworks live in mltrace.pytorch (and the other adapters), the reader in
mltrace.trials, rules in mltrace.rules.
"""

#: The version (setup.cfg reads it; MLflow runs are tagged with it).
__version__ = "0.2.0"


from mltrace import modes  # noqa: E402 - after __version__, which setup.cfg reads
from mltrace._logging import configure_from_env as configure_logging
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import Collection, CollectionKeys
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial

__all__ = [
    "__version__", "modes", "ModeKeys", "SaveConfig", "SaveConfigMode", "ReductionConfig",
    "Collection", "CollectionKeys", "create_trial", "configure_logging", "FlightRecorderConfig",
]
