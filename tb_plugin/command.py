"""``mltrace tensorboard``: the subcommand this package adds to the ``mltrace`` command.

Registered through the ``mltrace.commands`` entry-point group (setup.cfg), so mltrace's CLI names
no plugin package. TensorBoard is imported only when the subcommand runs.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_command(subparsers: Any) -> None:
    """Add ``tensorboard`` to the ``mltrace`` command's subparsers."""
    tensorboard = subparsers.add_parser(
        "tensorboard", help="start TensorBoard with the mltrace tab on the trials under DIR_OR_S3",
        description="Find mltrace trials under DIR_OR_S3 (a hook's out_dir, a folder of them, or "
                    "s3://...) and start TensorBoard on their tensorboard/ exports, with the "
                    "mltrace tab reading the trials. Arguments after DIR_OR_S3 go to TensorBoard, "
                    "e.g. --port 6007 --samples_per_plugin histograms=0.")
    tensorboard.add_argument("target", metavar="DIR_OR_S3",
                             help="a trial (hook out_dir) or a folder of trials")
    tensorboard.add_argument("--print-command", action="store_true",
                             help="print the TensorBoard command and exit (put it before "
                                  "DIR_OR_S3)")
    tensorboard.add_argument("tensorboard_args", nargs=argparse.REMAINDER,
                             help="arguments after DIR_OR_S3 go to TensorBoard (e.g. --port 6007)")
    tensorboard.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from .launch import run_cli  # TensorBoard only when the subcommand runs

    return run_cli(args)
