"""mltrace.watch: ``mltrace watch`` and the team set-up it runs in."""
