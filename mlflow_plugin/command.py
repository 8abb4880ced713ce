"""``mltrace compare``: the subcommand this package adds to the ``mltrace`` command.

Registered through the ``mltrace.commands`` entry-point group (setup.cfg), so mltrace's CLI names
no plugin package. Defining the arguments imports nothing heavy; MLflow is imported only when
the subcommand runs.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_command(subparsers: Any) -> None:
    """Add ``compare`` to the ``mltrace`` command's subparsers."""
    compare = subparsers.add_parser(
        "compare", help="compare MLflow training runs across experiments: tensor statistics per "
                        "step, rule findings",
        description="Table and PNG of chosen tensor statistics per step and the rule findings of "
                    "each MLflow training run (mltrace.trial tag) of the experiments; also logged "
                    "to MLflow.")
    compare.add_argument("experiments", nargs="*",
                         help="experiment names (default: all experiments)")
    compare.add_argument("--filter", default="",
                         help="MLflow filter string, e.g. \"params.lr = '0.1'\"")
    compare.add_argument("--run-id", action="append", default=None,
                         help="compare these runs (repeatable)")
    compare.add_argument("--tensor", action="append", default=None,
                         help="tensor name or regex (repeatable; default: the losses collection)")
    compare.add_argument("--stat", action="append", default=None,
                         help="statistic per step: mean, std, l2, abs_max, ... (repeatable; "
                              "default mean)")
    compare.add_argument("--out", default="mltrace-compare",
                         help="output folder (default ./mltrace-compare)")
    compare.add_argument("--max-runs", type=int, default=20)
    compare.add_argument("--max-tensors", type=int, default=48,
                         help="compare at most this many tensors, the first in natural order "
                              "(the others are named as left out; 0: all; default 48)")
    compare.add_argument("--rtol", type=float, default=1e-3,
                         help="two runs part ways where a statistic differs by more than this "
                              "fraction (default 0.001)")
    compare.add_argument("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI")
    compare.add_argument("--no-log", action="store_true", help="do not log the result to MLflow")
    compare.add_argument("--log-experiment", default="mltrace-comparisons",
                         help="experiment of the run the result is logged to (default "
                              "mltrace-comparisons)")
    compare.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from .compare import run_cli  # MLflow only when the subcommand runs

    return run_cli(args)
