"""mltrace.rules: the engine, the built-in rules and the rule CLI."""
