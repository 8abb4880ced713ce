"""The reader: ``create_trial(path)`` opens a trial, smdebug's analysis API over a hook's output.

- :mod:`~mltrace.trials.trial`: ``Trial``, joining the parts below, and ``Tensor`` objects.
- :mod:`~mltrace.trials.refresh`: reading new index files, and which steps are complete.
- :mod:`~mltrace.trials.steps`: steps, modes and workers; ``StepState``; waiting for steps.
- :mod:`~mltrace.trials.names`: tensor names and collections; one tensor's index entries.
- :mod:`~mltrace.trials.records`: reading and checking records; the flight recorder's records.
- :mod:`~mltrace.trials.tensor`: ``Tensor``, one tensor's values, reductions and shapes over steps.
- :mod:`~mltrace.trials.index`: where each record lives, as the index files say.
- :mod:`~mltrace.trials.kinds`: smdebug's ``LocalTrial`` and ``S3Trial``.
- :mod:`~mltrace.trials.create`: ``create_trial``.
"""

from mltrace.trials.create import create_trial
from mltrace.trials.index import Location, TensorEntries
from mltrace.trials.kinds import LocalTrial, S3Trial
from mltrace.trials.tensor import Tensor
from mltrace.trials.trial import StepState, Trial

__all__ = ["LocalTrial", "Location", "S3Trial", "StepState", "Tensor", "TensorEntries", "Trial",
           "create_trial"]
