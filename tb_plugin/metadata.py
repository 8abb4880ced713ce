"""Names the plugin shares with TensorBoard and its frontend (no imports: the loader uses it)."""

#: URL prefix (/data/plugin/mltrace/...) and TensorBoard's plugin key.
PLUGIN_NAME = "mltrace"
#: The tab's label.
TAB_NAME = "mltrace"
#: Version of the JSON the data routes answer with (bump on incompatible changes).
API_VERSION = 1
#: The plugin's own TensorBoard flags (``tensorboard --mltrace_logdir DIR``).
LOGDIR_FLAG = "mltrace_logdir"
MLFLOW_FLAG = "mltrace_mlflow_uri"
