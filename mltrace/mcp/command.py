"""``mltrace mcp [--root DIR | --root s3://bucket/prefix]``: the MCP server over stdio.

The MCP SDK (the ``mcp`` extra) is imported only when the command runs, so ``mltrace --help``
and ``import mltrace`` work without it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EPILOG = """examples:
  mltrace mcp --root /data/runs
  mltrace mcp --root s3://my-bucket/jobs
An MCP client starts it and speaks to it on stdin/stdout; for example, in its configuration:
  {"mcpServers": {"mltrace": {"command": "mltrace", "args": ["mcp", "--root", "/data/runs"]}}}"""


def add_command(subparsers: Any) -> None:
    """Register ``mltrace mcp`` on the ``mltrace`` command's subparsers (as the other commands)."""
    mcp = subparsers.add_parser(
        "mcp", help="serve the trials under a folder to AI agents (Model Context Protocol, stdio)",
        description="A Model Context Protocol server over stdio: an agent lists the trials under "
                    "the root, describes one, reads a tensor's values over steps, the rule "
                    "results and a diagnosis. It reads nothing outside the root.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    mcp.add_argument("--root", default=".",
                     help="the folder (or s3://bucket/prefix) whose trials are served; every "
                          "trial argument is a path relative to it (default: the current folder)")
    mcp.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Serve until the client closes stdin; exit code 2 when the server cannot start."""
    from mltrace.exceptions import MltraceError
    from mltrace.mcp.root import TrialRoot

    try:
        from mltrace.mcp.server import create_server
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "mcp":
            raise
        print('mltrace mcp: error: the MCP server needs the MCP SDK: pip install "mltrace[mcp]"',
              file=sys.stderr)
        return 2
    try:
        root = TrialRoot(args.root)
    except MltraceError as exc:
        print(f"mltrace mcp: error: {exc}", file=sys.stderr)
        return 2
    create_server(root).run("stdio")
    return 0
