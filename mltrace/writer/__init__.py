"""The write side: a worker's tensors become a trial's files, and TensorBoard's.

- :mod:`~mltrace.writer.trial_writer`: ``TrialWriter``, a step's events and index files, handed
  to whoever writes them, in order.
- :mod:`~mltrace.writer.process` and :mod:`~mltrace.writer.child`: the child process that writes a
  local trial's files, fed through a pipe (``child`` is standard library only, run by path).
- :mod:`~mltrace.writer.byte_queue`: the bounded queue of the background thread.
- :mod:`~mltrace.writer.spill`: a remote store's files kept on local disk while it is down.
- :mod:`~mltrace.writer.failure_log`: what a background writer does with a file it cannot write.
- :mod:`~mltrace.writer.tensorboard` and :mod:`~mltrace.writer.histogram_bins`: the TensorBoard
  export (``export_tensorboard=True``) and its histogram buckets.
"""

from mltrace.writer.trial_writer import TrialWriter

__all__ = ["TrialWriter"]
