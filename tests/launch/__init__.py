"""mltrace.launch: ``mltrace run`` on unmodified scripts."""
