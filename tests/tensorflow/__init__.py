"""mltrace.tensorflow: KerasHook, SessionHook, gradient tapes, MirroredStrategy, examples."""
