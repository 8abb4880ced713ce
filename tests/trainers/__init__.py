"""mltrace.trainers: the Transformers and Lightning callbacks."""
