"""XGBoost adapter: ``Hook``, a training callback for ``xgb.train`` and the scikit-learn API.

Porting from smdebug is the import: ``import mltrace.xgboost as smd``. See mltrace.xgboost.hook
for what is saved and how it differs from smdebug 1.0.34.

Example:
    >>> import mltrace.xgboost as smd
    >>> hook = smd.Hook(out_dir="/tmp/run", train_data=dtrain, validation_data=dval,
    ...                 include_collections=["metrics", "feature_importance"])
    >>> xgb.train(params, dtrain, evals=[(dtrain, "train"), (dval, "validation")], callbacks=[hook])
    >>> hook.close()
"""

from mltrace import modes
from mltrace.capture.hook import del_hook, set_hook
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import Collection, CollectionKeys
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.trials import create_trial
from mltrace.xgboost.collection import (
    DEFAULT_COLLECTIONS,
    DEFAULT_INCLUDE_COLLECTIONS,
    DEFAULT_SAVE_INTERVAL,
)
from mltrace.xgboost.hook import (
    Hook,
    add_to_collection,
    create_from_json_file,
    get_collection,
    get_hook,
)

__all__ = [
    "Hook", "Collection", "CollectionKeys", "FlightRecorderConfig", "SaveConfig", "SaveConfigMode",
    "ReductionConfig", "modes", "get_collection", "add_to_collection", "get_hook", "set_hook",
    "del_hook", "create_trial",
    "create_from_json_file", "DEFAULT_COLLECTIONS", "DEFAULT_INCLUDE_COLLECTIONS",
    "DEFAULT_SAVE_INTERVAL",
]
