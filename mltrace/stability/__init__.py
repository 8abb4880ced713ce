"""Transformer training stability, framework-neutral: the signals' names and collections
(mltrace.stability.signals) and the trailing-window statistics the stability rules judge them
by (mltrace.stability.windows)."""
