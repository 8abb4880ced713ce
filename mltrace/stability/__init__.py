"""Transformer training stability, framework-neutral: the signals' names and collections
(mltrace.stability.signals), the per-sample losses and input fingerprints that say which batch
and which samples a step trained on (mltrace.stability.samples), and the trailing-window
statistics the stability rules judge the signals by (mltrace.stability.windows)."""
