"""mltrace.cli: the ``mltrace`` command as a shell user meets it."""
