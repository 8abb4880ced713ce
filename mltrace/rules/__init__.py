"""Rules: conditions checked over a trial, step by step, and the built-in ones.

    from mltrace.rules import Rule, invoke_rule
"""

from typing import Any

from mltrace.rules.rule import Rule

__all__ = ["Rule", "invoke_rule"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `python -m mltrace.rules.rule_invoker` runs the module once.
    if name == "invoke_rule":
        from mltrace.rules.rule_invoker import invoke_rule

        return invoke_rule
    raise AttributeError(name)
