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
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import xgboost as xgb
from xgboost import collective

from mltrace.collections import Collection, CollectionKeys, PendingCollections, manager_with_defaults
from mltrace.config import ReductionConfig, SaveConfig
from mltrace.exceptions import MltraceTypeError
from mltrace.hook import BaseHook, as_numpy, get_hook, guarded
from mltrace.json_config import create_hook_from_config
from mltrace.xgboost import _model

logger = logging.getLogger(__name__)
K = CollectionKeys
DEFAULT_SAVE_INTERVAL = 10
DEFAULT_COLLECTIONS: dict[str, list[str]] = {
    K.ALL: [],
    K.DEFAULT: [],
    K.HYPERPARAMETERS: [r"^hyperparameters/.*$"],
    # XGBoost forbids "-" in evaluation set names, so <data>-<metric> splits at the first "-".
    K.METRICS: [r"^[^-/]+-[^/]+$"],
    # Not the metrics XGBoost maximizes (early stopping's rule), nor xgb.cv's "-std" companions.
    K.LOSSES: [r"^[^-/]+-(?!(?:auc|pre|ndcg|map(?!e$)))(?!interval-regression-accuracy$)"
               r"[^/]+(?<!-std)$"],
    K.PREDICTIONS: [r"^predictions$"],
    K.LABELS: [r"^labels$"],
    K.FEATURE_IMPORTANCE: [r"^feature_importance/.*"],
    K.AVERAGE_SHAP: [r"^average_shap/(?!bias$).+$"],
    K.FULL_SHAP: [r"^full_shap/(?!bias$).+$"],
    K.TREES: [r"^trees/.*"],
}
DEFAULT_INCLUDE_COLLECTIONS = [K.METRICS]
#: Collections whose tensors are never reduced (strings, or values a reduction would lose).
RAW_ONLY_COLLECTIONS = (K.HYPERPARAMETERS, K.TREES)
_NEEDS_BOOSTER = (K.PREDICTIONS, K.FEATURE_IMPORTANCE, K.TREES, K.FULL_SHAP, K.AVERAGE_SHAP)


# Collections made with smd.get_collection(...) before a hook exists go to the next hook.
_pending = PendingCollections(lambda: manager_with_defaults(DEFAULT_COLLECTIONS))


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current XGBoost hook, or of the hook about to be created."""
    return _pending.of(get_hook(), Hook, name, create)


def add_to_collection(collection_name: str, args: Any) -> None:
    """Add tensor names (or regexes) to a collection, as smdebug's module-level helper."""
    get_collection(collection_name).include(args)


class Hook(BaseHook):
    """Saves metrics, hyperparameters, predictions, labels, feature importance, SHAP values and
    trees of XGBoost training, one step per boosting round (see the module docstring).

    An ``xgboost.callback.TrainingCallback`` (registered as its virtual subclass, so the hook
    has one base class). Create one hook per training run: a hook passed to a second training
    goes on counting steps after the first run's last one.

    Args: as mltrace.hook.BaseHook (smdebug's constructor, in smdebug's order), except
        save_config: default every 10 rounds (smdebug's XGBoost default).
        reduction_config: applied to predictions, labels and full_shap, the collections of
            arrays (smdebug ignored it for XGBoost with a warning); the other collections are
            always saved whole.
      and, as smdebug's XGBoost hook,
        hyperparameters: dict saved as ``hyperparameters/<name>`` (strings and numbers).
        train_data: data for SHAP values: a DMatrix, ``(X, y)``, or ``(path, "csv"|"libsvm")``.
        validation_data: data for predictions and labels, in the same forms.
        strict, mlflow, stop_check_interval: as mltrace.pytorch.Hook.

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
    ) -> None:
        # Read by close() (also at exit), so set before anything can fail.
        self._round_written = False
        self._carried: list[tuple[str, np.ndarray, Any]] = []
        manager = _pending.take()
        super().__init__(
            out_dir,  # type: ignore[arg-type]
            export_tensorboard, tensorboard_dir, dry_run, reduction_config, save_config,
            include_regex, include_collections, save_all, include_workers, strict,
            mlflow, stop_check_interval,
            collection_manager=manager,
            default_include_collections=DEFAULT_INCLUDE_COLLECTIONS,
            default_saved_collections=DEFAULT_INCLUDE_COLLECTIONS,
            default_save_config=SaveConfig(save_interval=DEFAULT_SAVE_INTERVAL),
        )
        self.hyperparameters = hyperparameters  # type: ignore[assignment]
        self.train_data = train_data
        self.validation_data = validation_data
        hp = self.get_collection(K.HYPERPARAMETERS)
        # Saved once, at the first round; the marker tells our default from a user's config.
        self._hp_config = (None if hp.has_own_save_config()
                           else SaveConfig(save_steps=[0], end_step=0))
        if self._hp_config is not None:
            hp.save_config = self._hp_config
        self._model_info: tuple[int, _model.ModelInfo] | None = None
        self._labels: np.ndarray | None = None
        self._wanted_cache: dict[tuple[str, frozenset[str]], bool] = {}
        self._warned: set[str] = set()

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Hook:
        """Build a hook from smdebug's JSON configuration (see mltrace.json_config); save keys the
        file leaves out take XGBoost's defaults (every 10 rounds). Set ``hook.train_data``,
        ``hook.validation_data`` and ``hook.hyperparameters`` afterwards, as with smdebug."""
        return create_hook_from_config(cls, json_file_path,
                                       save_defaults={"save_interval": DEFAULT_SAVE_INTERVAL})

    # -- data given by the user (settable later, as smdebug's docs do) ---------------------------
    @property
    def hyperparameters(self) -> dict[str, Any] | None:
        """The hyperparameters saved in collection ``hyperparameters``."""
        return self._hyperparameters

    @hyperparameters.setter
    def hyperparameters(self, value: Mapping[str, Any] | None) -> None:
        if value is not None and not isinstance(value, Mapping):
            raise MltraceTypeError(
                f"hyperparameters must be a dict of names to values, got {type(value).__name__}")
        self._hyperparameters = None if value is None else dict(value)

    @property
    def train_data(self) -> xgb.DMatrix | None:
        """Data the SHAP values are computed on."""
        return self._train_data

    @train_data.setter
    def train_data(self, value: Any) -> None:
        self._train_data = _model.as_dmatrix("train_data", value)

    @property
    def validation_data(self) -> xgb.DMatrix | None:
        """Data the predictions and labels come from."""
        return self._validation_data

    @validation_data.setter
    def validation_data(self, value: Any) -> None:
        self._validation_data = _model.as_dmatrix("validation_data", value)
        self._labels = None

    # -- the TrainingCallback interface ------------------------------------------------------------
    def before_training(self, model: Any) -> Any:
        """XGBoost callback: forget what was cached about the previous model."""
        self._model_info = None
        self._wanted_cache.clear()
        return model

    def before_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        """XGBoost callback: nothing to do before a round."""
        return False

    @guarded(default=False)
    def after_iteration(self, model: Any, epoch: int, evals_log: Mapping[str, Any]) -> bool:
        """XGBoost callback: save this round's step. Returns True (stop) if a rule asked to stop."""
        self._begin_round(self._round_of(model, epoch))
        if self.step_active and self.writer is not None:  # no work for a worker that does not write
            self._save_round(model, evals_log)
        self._end_round()
        return self.stop_requested is not None

    def after_training(self, model: Any) -> Any:
        """XGBoost callback: make every saved round readable now (close() still ends the trial)."""
        self._training_done()
        return model

    @guarded()
    def _training_done(self) -> None:
        if self.stop_requested is not None:
            logger.warning("training stopped on a rule's request: closing the trial")
            self.close()
        elif self.writer is not None:
            self._export_collections()
            self.writer.flush()

    # -- steps ---------------------------------------------------------------------------------
    def _round_of(self, model: Any, epoch: int) -> int:
        """The boosting round just done: the model's round count - 1 (equal to ``epoch`` unless
        training resumed from a saved model); after a previous run's steps if the hook is reused."""
        rounds = getattr(model, "num_boosted_rounds", None)
        rnd = rounds() - 1 if callable(rounds) else epoch
        if rnd <= self.step:
            self._warn_once("reused", "this hook already saved step %d; a new training run with "
                            "the same hook continues at step %d (use one hook per run to keep "
                            "step = boosting round)", self.step, self.step + 1)
            rnd = self.step + 1
        return rnd

    def _begin_round(self, rnd: int) -> None:
        hp = self.collection_manager.collections.get(K.HYPERPARAMETERS)
        if self.step < 0 and hp is not None and hp.save_config is self._hp_config:
            self._hp_config.save_steps = [rnd]  # the first round, also when training resumed
        self._begin_step(rnd)
        self._round_written = False
        carried, self._carried = self._carried, []
        for name, value, collections in carried:
            BaseHook.save_tensor(self, name, value, collections)

    def _end_round(self) -> None:
        super()._end_step()
        self._round_written = True

    def _end_step(self) -> None:
        # A round's files are written when its callback ends and cannot be appended to later:
        # what arrives between rounds waits for the next round.
        if not self._round_written:
            super()._end_step()

    def _finish(self, write_end_marker: bool) -> None:
        if (self._round_written and self.writer is not None and not self._disabled
                and (self._pending_scalars or self._carried)):
            self._begin_round(self.step + 1)  # saved after training: one step after the last round
        super()._finish(write_end_marker)

    @guarded()
    def save_tensor(self, tensor_name: str, tensor_value: Any,
                    collections_to_write: str | Iterable[str] = "default") -> None:
        """Save a tensor of your own this round (or the next one, if this round is written)."""
        if self._round_written:
            try:  # a copy: the caller may change the array before the next round
                value = np.array(self._to_numpy(tensor_value), copy=True)
            except MltraceTypeError as exc:
                self._warn_once(f"save_tensor:{tensor_name}", "not saving tensor %r: %s",
                                tensor_name, exc)
                return
            self._carried.append((tensor_name, value, collections_to_write))
        else:
            super().save_tensor(tensor_name, tensor_value, collections_to_write)

    # -- what a round saves ----------------------------------------------------------------------
    def _save_round(self, model: Any, evals_log: Mapping[str, Any]) -> None:
        for name, value in (self._hyperparameters or {}).items():
            self._save_for_tensor(f"hyperparameters/{name}", value)
        if self._hyperparameters is None and self._wanted(K.HYPERPARAMETERS, lambda: ()):
            self._warn_once(K.HYPERPARAMETERS, "collection hyperparameters is saved but the hook "
                            "has none: pass Hook(hyperparameters=params)")
        for name, value in _metric_values(evals_log):
            self._save_for_tensor(name, value)
        if not isinstance(model, xgb.Booster):
            if any(self._wanted(c, lambda: ()) for c in _NEEDS_BOOSTER):
                self._warn_once("cv", "the model is a %s, not a Booster (xgb.cv?): only metrics, "
                                "losses and hyperparameters are saved", type(model).__name__)
            return
        if (self._wanted(K.PREDICTIONS, lambda: ["predictions"])
                and self._needs("validation_data", K.PREDICTIONS)):
            self._save_for_tensor("predictions", model.predict(self._validation_data))
        if self._wanted(K.LABELS, lambda: ["labels"]) and self._needs("validation_data", K.LABELS):
            if self._labels is None:
                self._labels = self._validation_data.get_label()  # type: ignore[union-attr]
            self._save_for_tensor("labels", self._labels)
        self._save_tree_collections(model)
        self._save_shap(model)

    def _save_tree_collections(self, model: xgb.Booster) -> None:
        fi = self._wanted(K.FEATURE_IMPORTANCE, lambda: [
            f"feature_importance/{t}/{f}"
            for t in _model.IMPORTANCE_TYPES for f in self._info(model).feature_names])
        trees = self._wanted(K.TREES, lambda: [f"trees/{c}" for c in _model.TREE_COLUMNS])
        if not (fi or trees):
            return
        info = self._info(model)
        if not info.has_trees:
            self._warn_once("gblinear", "feature importance and trees exist for tree boosters "
                            "only, not %s: not saved", info.booster_type)
            return
        if fi:
            for kind in _model.IMPORTANCE_TYPES:
                for feature, value in _model.normalized_importance(model, kind).items():
                    self._save_for_tensor(f"feature_importance/{kind}/{feature}", value)
        if trees:
            for column, values in _model.round_trees(model, model.num_boosted_rounds() - 1).items():
                self._save_for_tensor(f"trees/{column}", values)

    def _save_shap(self, model: xgb.Booster) -> None:
        shap_columns = lambda: [*self._info(model).feature_names, "bias"]  # noqa: E731
        full = self._wanted(K.FULL_SHAP, lambda: [f"full_shap/{c}" for c in shap_columns()])
        average = self._wanted(K.AVERAGE_SHAP,
                               lambda: [f"average_shap/{c}" for c in shap_columns()])
        if not (full or average):
            return
        if not self._needs("train_data", K.FULL_SHAP if full else K.AVERAGE_SHAP):
            return
        values = _model.shap_values(model, self._train_data)  # type: ignore[arg-type]
        columns = shap_columns()
        if values.shape[-1] != len(columns):
            self._warn_once("shap", "SHAP values have %d columns for %d features: not saved",
                            values.shape[-1], len(columns) - 1)
            return
        if full:
            for i, column in enumerate(columns):
                self._save_for_tensor(f"full_shap/{column}", np.ascontiguousarray(values[..., i]))
        if average:
            means = values.mean(axis=tuple(range(values.ndim - 1)))
            for i, column in enumerate(columns):
                self._save_for_tensor(f"average_shap/{column}", means[i])

    # -- helpers --------------------------------------------------------------------------------
    def _wanted(self, group: str, names: Callable[[], Iterable[str]]) -> bool:
        """True if a collection due this step holds tensors of ``group``: the group's own
        collection, or another due collection (``all``, ``default``, a user's) matching one of
        the group's possible ``names`` (cached per training: names only change with the model)."""
        others = frozenset(c.name for c in self._due if c.name != group)
        if len(others) != len(self._due):
            return True
        if not others:
            return False
        key = (group, others)
        if key not in self._wanted_cache:
            colls = [c for c in self._due if c.name in others]
            self._wanted_cache[key] = any(c.matches(n) for n in names() for c in colls)
        return self._wanted_cache[key]

    def _needs(self, data: str, collection: str) -> bool:
        if getattr(self, f"_{data}") is not None:
            return True
        self._warn_once(data, "collection %s is saved but the hook has no %s: pass Hook(%s=...)",
                        collection, data, data)
        return False

    def _info(self, model: xgb.Booster) -> _model.ModelInfo:
        if self._model_info is None or self._model_info[0] != id(model):
            self._model_info = (id(model), _model.ModelInfo(model))
        return self._model_info[1]

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _prepare_collections(self) -> None:
        super()._prepare_collections()
        for name in RAW_ONLY_COLLECTIONS:
            coll = self.collection_manager.collections.get(name)
            if coll is not None:
                if coll.effective_reduction_config().items():
                    logger.warning("collection %s is always saved whole: its reductions are "
                                   "ignored", name)
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)

    def _worker_identity(self) -> tuple[str, int]:
        if collective.is_distributed():
            return f"worker_{collective.get_rank()}", collective.get_world_size()
        return "worker_0", 1

    def _to_numpy(self, value: Any) -> np.ndarray:
        if isinstance(value, str):
            return np.array([value])  # smdebug: a string hyperparameter is a 1-d string array
        try:
            return as_numpy(value)
        except ValueError as exc:  # e.g. a ragged list of lists
            raise MltraceTypeError(f"cannot save {value!r} as an array: {exc}") from None

    def _reduce(self, value: Any, items: list[tuple[str, bool]]) -> list[np.ndarray | None]:
        array = self._to_numpy(value)
        if array.dtype.kind not in "biuf":
            return [None] * len(items)  # strings (tree columns) have no reductions
        return super()._reduce(array, items)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        logger.warning("a copy of an mltrace XGBoost hook (copy.deepcopy, sklearn.clone, pickling) "
                       "saves nothing: pass the original hook, or create one per training run")


def _metric_values(evals_log: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(<data>-<metric>, value of this round)``; xgb.cv's (mean, std) pairs give the mean under
    the name and the std under ``<name>-std``."""
    out: list[tuple[str, Any]] = []
    for data, metrics in evals_log.items():
        for metric, history in metrics.items():
            if not history:
                continue
            last = history[-1]
            name = f"{data}-{metric}"
            if isinstance(last, tuple) and len(last) == 2:
                out += [(name, float(last[0])), (f"{name}-std", float(last[1]))]
            else:
                out.append((name, last))
    return out


def create_from_json_file(json_file_path: str | None = None) -> Hook:
    """``Hook.create_from_json_file`` as a module-level function."""
    return Hook.create_from_json_file(json_file_path)


xgb.callback.TrainingCallback.register(Hook)
