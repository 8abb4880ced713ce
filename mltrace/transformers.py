"""``mltrace.transformers``: the public name of the Hugging Face Transformers callback
(``from mltrace.transformers import MltraceCallback``); it lives in mltrace.trainers.transformers."""

from mltrace.trainers.transformers import MltraceCallback

__all__ = ["MltraceCallback"]
