"""``mltrace.lightning``: the public name of the Lightning callback
(``from mltrace.lightning import MltraceCallback``); it lives in mltrace.trainers.lightning."""

from mltrace.trainers.lightning import MltraceCallback

__all__ = ["MltraceCallback"]
