"""The XGBoost hook: an ``xgboost.callback.TrainingCallback`` saving one step per boosting round.

Pass it to ``xgb.train(..., callbacks=[hook])`` or to the scikit-learn API
(``XGBRegressor(callbacks=[hook])``). The step is the boosting round: round ``i`` of a fresh
model is step ``i``; training resumed from a saved model goes on from that model's round count.
Mode: GLOBAL, as smdebug (``hook.set_mode`` changes it). Default SaveConfig: every 10 rounds.

Tensors (smdebug's names) and their collections:

- ``metrics``: ``<data>-<metric>`` per evaluation set and metric (``train-rmse``,
  ``validation_0-logloss``), the value of this round. Saved by default, always included.
- ``losses``: the same names for metrics XGBoost minimizes (not auc*, pre*, map*, ndcg*,
  interval-regression-accuracy; XGBoost's own early-stopping rule).
- ``hyperparameters``: ``hyperparameters/<name>`` from the ``hyperparameters`` dict, saved once,
  at the first round (step 0), unless the collection is given a SaveConfig of its own.
- ``predictions``, ``labels``: ``model.predict`` and the labels of ``validation_data``.
- ``feature_importance``: ``feature_importance/<type>/<feature>`` for weight, gain, cover,
  total_gain, total_cover, each normalized to sum 1 (tree boosters only).
- ``full_shap``: ``full_shap/<feature>``, that feature's SHAP values over ``train_data``
  (shape (samples,), or (samples, classes)); ``average_shap``: ``average_shap/<feature>``, their
  mean over samples (and classes), as smdebug computes it. The bias column is left out.
- ``trees``: ``trees/<column>`` (Tree, Node, ID, Feature, Split, Yes, No, Missing, Gain, Cover,
  Category, as ``Booster.trees_to_dataframe``) for the trees of this round.

Differences from smdebug 1.0.34, all deliberate:

- each ``full_shap/<feature>`` holds that feature's column (smdebug stored the whole SHAP matrix
  under every name);
- ``trees`` holds every tree of the round (smdebug took tree number ``round``, wrong for
  multi-class models and for resumed training);
- collection regexes match evaluation sets with digits (``validation_0`` of the scikit-learn
  API) and metrics such as ``ndcg@5``; ``losses`` leaves out every metric XGBoost maximizes
  (smdebug's counted aucpr, ndcg and map@n as losses); the SHAP regexes drop only the feature
  named ``bias`` (smdebug's ``[^/bias]`` dropped any feature whose name ends in a, b, i, s);
- ``reduction_config`` is honoured for the array collections ``predictions``, ``labels`` and
  ``full_shap`` (smdebug ignored it for XGBoost with a warning); metrics, losses,
  feature_importance, average_shap, hyperparameters and trees are always saved whole;
- ``xgb.cv`` is accepted: metrics are saved as the mean over folds, plus ``<name>-std``.

Step files are written at the end of each round's callback, so a reader sees round N as soon as
the round ends. ``save_scalar`` / ``save_tensor`` called after the hook's callback of a round land
in the next round (as smdebug); those called after training go into one extra step at close().
A rule's StopTraining signal ends boosting after the round in which the hook sees it, through
XGBoost's own mechanism (``after_iteration`` returns True), and the trial is closed when training
returns; ``hook.stop_requested`` says which rule asked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, SupportsIndex

import xgboost as xgb

from mltrace.capture.forwarding import Forwarded
from mltrace.capture.hook import Hook as CoreHook
from mltrace.capture.hook import get_hook as _current_hook
from mltrace.capture.hook import hook_of_class
from mltrace.capture.json_config import create_hook_from_config
from mltrace.capture.options import HookOptions
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import Collection
from mltrace.config import ReductionConfig, SaveConfig
from mltrace.xgboost.adapter import XGBoostAdapter
from mltrace.xgboost.collection import (
    DEFAULT_COLLECTIONS,
    DEFAULT_INCLUDE_COLLECTIONS,
    DEFAULT_SAVE_INTERVAL,
    pending,
)

logger = logging.getLogger(__name__)


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current XGBoost hook, or of the hook about to be created."""
    return pending.of(_current_hook(), Hook, name, create)


def get_hook(json_config_path: str | None = None, create_if_not_exists: bool = True) -> Hook | None:
    """The current XGBoost hook (smdebug's ``get_hook``): the one created last or given to
    ``set_hook``; else one built from the JSON configuration (``json_config_path``, else
    ``MLTRACE_CONFIG_FILE_PATH`` / ``SMDEBUG_CONFIG_FILE_PATH``), or None if there is none.
    smdebug's XGBoost ``get_hook`` always tried to create one; pass ``create_if_not_exists=False``
    to only look."""
    return hook_of_class(Hook, lambda core: core, json_config_path, create_if_not_exists)


def add_to_collection(collection_name: str, args: Any) -> None:
    """Add tensor names (or regexes) to a collection, as smdebug's module-level helper."""
    get_collection(collection_name).include(args)


class Hook(CoreHook):
    """Saves metrics, hyperparameters, predictions, labels, feature importance, SHAP values and
    trees of XGBoost training, one step per boosting round (see the module docstring).

    An ``xgboost.callback.TrainingCallback`` (registered as its virtual subclass, so the hook
    has one base class). Create one hook per training run: a hook passed to a second training
    goes on counting steps after the first run's last one.

    Args: smdebug's constructor, in smdebug's order (each is described in
    mltrace.capture.options.HookOptions), except
        save_config: default every 10 rounds (smdebug's XGBoost default).
        reduction_config: applied to predictions, labels and full_shap, the collections of
            arrays (smdebug ignored it for XGBoost with a warning); the other collections are
            always saved whole.
      and, as smdebug's XGBoost hook,
        hyperparameters: dict saved as ``hyperparameters/<name>`` (strings and numbers).
        train_data: data for SHAP values: a DMatrix, ``(X, y)``, or ``(path, "csv"|"libsvm")``.
        validation_data: data for predictions and labels, in the same forms.

    Raises:
        MltraceValueError, MltraceTypeError: invalid arguments (the message names the fix).
    """

    def __init__(
        self,
        out_dir: str | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: Any = None,
        include_regex: str | Iterable[str] | None = None,
        include_collections: Iterable[str] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        hyperparameters: Mapping[str, Any] | None = None,
        train_data: Any = None,
        validation_data: Any = None,
        strict: bool = False,
        mlflow: bool | dict[str, Any] | None = None,
        stop_check_interval: float | None = None,
        flight_recorder: FlightRecorderConfig | dict[str, Any] | bool | None = None,
    ) -> None:
        options = HookOptions.from_front_door(locals())  # smdebug's arguments, by name
        self.xgboost = XGBoostAdapter(hyperparameters, train_data, validation_data)
        super().__init__(options, self.xgboost, collection_manager=pending.take(),
                         default_include_collections=DEFAULT_INCLUDE_COLLECTIONS,
                         default_saved_collections=DEFAULT_INCLUDE_COLLECTIONS,
                         default_save_config=SaveConfig(save_interval=DEFAULT_SAVE_INTERVAL))

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Hook:
        """Build a hook from smdebug's JSON configuration (see mltrace.capture.json_config); save keys the
        file leaves out take XGBoost's defaults (every 10 rounds). Set ``hook.train_data``,
        ``hook.validation_data`` and ``hook.hyperparameters`` afterwards, as with smdebug."""
        return create_hook_from_config(cls, json_file_path,
                                       save_defaults={"save_interval": DEFAULT_SAVE_INTERVAL})

    # -- data given by the user (settable later, as smdebug's docs do; the adapter checks it) ------
    hyperparameters = Forwarded[dict[str, Any] | None](
        "xgboost", "The hyperparameters saved in collection ``hyperparameters`` (a dict, or None).",
        settable=True)
    train_data = Forwarded[xgb.DMatrix | None](
        "xgboost", "Data the SHAP values are computed on (set as a DMatrix, ``(X, y)`` or a file).",
        settable=True)
    validation_data = Forwarded[xgb.DMatrix | None](
        "xgboost", "Data the predictions and labels come from (set as train_data).", settable=True)

    # -- the TrainingCallback interface ------------------------------------------------------------
    def before_training(self, model: Any) -> Any:
        """XGBoost callback: forget what was cached about the previous model."""
        if not self.disabled:
            self.xgboost.before_training()
        return model

    def before_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        """XGBoost callback: nothing to do before a round."""
        return False

    def after_iteration(self, model: Any, epoch: int, evals_log: Mapping[str, Any]) -> bool:
        """XGBoost callback: save this round's step. Returns True (stop) if a rule asked to stop."""
        if self.disabled:  # also a copy of the hook, which has no adapter
            return False
        return self.xgboost.after_iteration(model, epoch, evals_log)

    def after_training(self, model: Any) -> Any:
        """XGBoost callback: make every saved round readable now (close() still ends the trial)."""
        if not self.disabled:
            self.xgboost.after_training()
        return model

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        """A copy (copy.deepcopy, sklearn.clone, pickling) is, as smdebug's, a hook that saves
        nothing (mltrace.capture.hook.Hook.__setstate__): say so when the copy is made."""
        return (_copied_hook, (type(self),), self.__getstate__())


def _copied_hook(cls: type[Hook]) -> Hook:
    """The object a copy of a hook starts as (its state, empty, is set by __setstate__)."""
    logger.warning("a copy of an mltrace XGBoost hook (copy.deepcopy, sklearn.clone, pickling) "
                   "saves nothing: pass the original hook, or create one per training run")
    return cls.__new__(cls)


def create_from_json_file(json_file_path: str | None = None) -> Hook:
    """``Hook.create_from_json_file`` as a module-level function."""
    return Hook.create_from_json_file(json_file_path)


xgb.callback.TrainingCallback.register(Hook)

__all__ = ["Hook", "get_hook", "get_collection", "add_to_collection", "create_from_json_file",
           "DEFAULT_COLLECTIONS", "DEFAULT_INCLUDE_COLLECTIONS", "DEFAULT_SAVE_INTERVAL"]
