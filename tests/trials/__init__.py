"""mltrace.trials: the reader (create_trial, Trial, Tensor), also on smdebug's own files."""
