"""Callbacks for the trainers people use with PyTorch, over one capture of the trainer's model.

- :mod:`~mltrace.trainers.capture`: ``TrainerCapture``, the hook a callback builds and attaches
  to the trainer's model (steps begin where the trainer says a batch begins).
- :mod:`~mltrace.trainers.transformers`: ``MltraceCallback`` for ``transformers.Trainer``
  (public name: ``mltrace.transformers``).
- :mod:`~mltrace.trainers.lightning`: ``MltraceCallback`` for ``lightning.Trainer`` (public
  name: ``mltrace.lightning``).

Nothing is imported here: each callback imports its trainer library, which the other does not need.
"""
