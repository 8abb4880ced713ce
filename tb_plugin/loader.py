"""TensorBoard's entry point for the mltrace plugin (``tensorboard_plugins`` group).

TensorBoard imports every entry point without a try/except, so an import error here would stop
TensorBoard for everyone in the environment. This module therefore imports nothing but
TensorBoard's base_plugin; the plugin itself (numpy, mltrace's reader) is imported in ``load()``,
where a failure is logged and the tab is left out while TensorBoard starts as usual.
"""

from __future__ import annotations

import logging

from tensorboard.plugins import base_plugin

from . import metadata

logger = logging.getLogger(__name__)


class MltracePluginLoader(base_plugin.TBLoader):
    """Adds ``--mltrace_logdir`` and ``--mltrace_mlflow_uri`` and builds the plugin."""

    def define_flags(self, parser) -> None:  # noqa: ANN001 - argparse parser from TensorBoard
        group = parser.add_argument_group(metadata.PLUGIN_NAME)
        group.add_argument(
            f"--{metadata.LOGDIR_FLAG}", metavar="PATH", type=str, default="",
            help="mltrace trials to show (a trial, or a folder of trials; local or s3://). Comma "
                 "separated for several. Trials one level above a tensorboard/ export under "
                 "--logdir are found without it.")
        group.add_argument(
            f"--{metadata.MLFLOW_FLAG}", metavar="URL", type=str, default="",
            help="base URL of the MLflow UI for links to rule runs (default: the tracking URI "
                 "a trial recorded, when it is http(s)).")

    def fix_flags(self, flags) -> None:  # noqa: ANN001
        url = getattr(flags, metadata.MLFLOW_FLAG, "") or ""
        if url and not url.startswith(("http://", "https://")):
            raise base_plugin.FlagsError(f"--{metadata.MLFLOW_FLAG}={url!r} must be an http(s) URL")

    def load(self, context):  # noqa: ANN001, ANN201
        try:
            from .plugin import MltracePlugin
        except Exception as exc:  # a broken optional dependency must not stop TensorBoard
            logger.error("mltrace TensorBoard plugin disabled: %s: %s", type(exc).__name__, exc)
            return None
        flags = context.flags
        roots = [
            r.strip()
            for r in (getattr(flags, metadata.LOGDIR_FLAG, "") or "").split(",")
            if r.strip()
        ]
        return MltracePlugin(
            context,
            mltrace_logdirs=roots,
            mlflow_uri=getattr(flags, metadata.MLFLOW_FLAG, "") or None,
        )
