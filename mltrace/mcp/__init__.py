"""``mltrace mcp``: a Model Context Protocol server that lets an AI agent read trials.

- :mod:`~mltrace.mcp.root`: ``TrialRoot``, the folder or S3 prefix served, and the trials in it;
  every trial argument is resolved there and refused when it leaves the root.
- :mod:`~mltrace.mcp.tools`: what each tool answers, as plain JSON-ready dicts (no MCP needed):
  ``list_trials``, ``describe_trial``, ``read_tensor``, ``read_rule_results``, ``diagnose``.
- :mod:`~mltrace.mcp.answers`: what the answers share (bounds and their errors; ``json_safe``,
  from :mod:`mltrace.format.json_safe`: NaN as ``"nan"``).
- :mod:`~mltrace.mcp.server`: the MCP wiring (``create_server``); imports the MCP SDK, the ``mcp``
  extra, so it is not imported here.
- :mod:`~mltrace.mcp.command`: the ``mltrace mcp`` subcommand.
"""

from mltrace.format.json_safe import json_safe
from mltrace.mcp.root import TrialRoot
from mltrace.mcp.tools import (
    describe_trial,
    diagnose,
    list_trials,
    read_rule_results,
    read_tensor,
)

__all__ = ["TrialRoot", "describe_trial", "diagnose", "json_safe", "list_trials",
           "read_rule_results", "read_tensor"]
