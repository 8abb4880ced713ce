"""mltrace.capture and the shared basics under it: the hook core, configuration,
collections, reductions, quiet steps, the flight recorder, logging and plugins."""
