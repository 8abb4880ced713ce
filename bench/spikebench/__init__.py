"""SpikeBench: which of mltrace's stability rules catches which transformer-training failure.

A benchmark that prints a table, not a test. Run it with ``bench/spikebench/run.py`` (see its
docstring). Its parts: ``corpus`` (the seeded synthetic language the model learns), ``scenarios``
(the failures injected and the rules meant to catch each), ``train`` (one run: model, optimizer,
schedule, the hook, the distributed runner), ``evaluate`` (the rules run offline over a trial)
and ``report`` (scoring and the table).
"""
