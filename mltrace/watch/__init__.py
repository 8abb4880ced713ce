"""``mltrace watch``: rules as a service over many trials (SageMaker Debugger's rule jobs).

One concept per module: ``spec`` (RULES.json), ``discovery`` (trials as they appear),
``selection`` (which rules apply to a trial), ``state`` (what finished, kept in the trials),
``execution`` (one rule on one trial), ``diagnosis`` (a trial that broke, diagnosed once after
its rules), ``executors`` (local process pool) and ``ray_executor``
(Ray cluster), ``scheduling`` (the cap and retries), ``service`` (the loop), ``command`` (CLI).
"""

from mltrace.watch.spec import TrialSelector, WatchRule, load_watch_rules, parse_watch_rules

__all__ = ["TrialSelector", "WatchRule", "load_watch_rules", "parse_watch_rules"]
