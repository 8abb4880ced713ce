"""The XGBoost side of the capture: what one boosting round saves, host copies of its values and
the worker's rank in ``xgboost.collective``.

mltrace.xgboost.hook.Hook is the front door (smdebug's constructor, the TrainingCallback methods)
and hands every callback to :class:`XGBoostAdapter`. A round is one step of the core hook:
``begin_step(round)``, the round's tensors, ``end_step()``, so the round's files are written when
its callback returns; what is saved between rounds or after training is the core's to place (the
next step, or one step more at close).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import xgboost as xgb
from xgboost import collective

from mltrace.capture.adapter import ReductionItems, as_numpy
from mltrace.capture.errors import guarded
from mltrace.capture.hook import Hook
from mltrace.capture.recording_adapter import RecordingAdapter
from mltrace.collections import Collection, CollectionKeys
from mltrace.config import ReductionConfig, SaveConfig
from mltrace.exceptions import MltraceTypeError
from mltrace.xgboost import _model
from mltrace.xgboost.collection import NEEDS_BOOSTER, RAW_ONLY_COLLECTIONS

logger = logging.getLogger(__name__)
K = CollectionKeys


class XGBoostAdapter(RecordingAdapter):
    """Saves a boosting round's metrics, hyperparameters, predictions, labels, feature importance,
    SHAP values and trees through the hook it is attached to.

    Args:
        hyperparameters, train_data, validation_data: as mltrace.xgboost.hook.Hook (checked here,
            before the hook exists, so a bad argument leaves no half-built hook behind).
    """

    def __init__(self, hyperparameters: Mapping[str, Any] | None, train_data: Any,
                 validation_data: Any) -> None:
        super().__init__()
        self._hyperparameters: dict[str, Any] | None = None
        self._train_data: xgb.DMatrix | None = None
        self._validation_data: xgb.DMatrix | None = None
        self._labels: np.ndarray | None = None
        self.hyperparameters = hyperparameters
        self.train_data = train_data
        self.validation_data = validation_data
        self._hp_config: SaveConfig | None = None  # our default for hyperparameters, if used
        self._model_info: tuple[Any, _model.ModelInfo] | None = None  # (model, its facts)
        #: the collections due this round and those the flight recorder was told to keep
        self._active: list[Collection] = []
        self._wanted_cache: dict[tuple[str, frozenset[str]], bool] = {}
        #: (the model, its round count minus XGBoost's epoch): constant over one training, so
        #: the round count (a call into libxgboost) is asked once per training, not per round
        self._round_offset: tuple[Any, int] | None = None

    def attach(self, hook: Hook) -> None:
        """Bind to ``hook`` (its error policy guards the callbacks) and save hyperparameters once,
        at the first round, unless the collection was given a SaveConfig of its own."""
        super().attach(hook)
        hp = hook.get_collection(K.HYPERPARAMETERS)
        if not hp.has_own_save_config():
            self._hp_config = SaveConfig(save_steps=[0], end_step=0)
            hp.save_config = self._hp_config

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

    # -- Adapter protocol -------------------------------------------------------------------------
    def worker_identity(self) -> tuple[str, int]:
        """``worker_<rank>`` and the world size of xgboost.collective (one worker outside it)."""
        if collective.is_distributed():
            return f"worker_{collective.get_rank()}", collective.get_world_size()
        return "worker_0", 1

    def to_numpy(self, value: Any) -> np.ndarray:
        """Host values as numpy; a string (a hyperparameter) as a 1-d string array, as smdebug."""
        if isinstance(value, str):
            return np.array([value])
        try:
            return as_numpy(value)
        except ValueError as exc:  # e.g. a ragged list of lists
            raise MltraceTypeError(f"cannot save {value!r} as an array: {exc}") from None

    def reduce(self, value: Any, items: ReductionItems) -> list[np.ndarray | None]:
        """numpy's reductions; none for strings (tree columns have no mean)."""
        array = self.to_numpy(value)
        if array.dtype.kind not in "biuf":
            return [None] * len(items)
        return super().reduce(array, items)

    def recordable(self, value: Any) -> bool:
        """The flight recorder keeps numbers only (metrics, predictions, importance, SHAP), not
        strings (an ``all`` collection's string hyperparameters) nor empty arrays."""
        if isinstance(value, str):
            return False
        array = np.asarray(value)
        return array.dtype.kind in "biuf" and array.size > 0

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """As the value is saved (a Python number as shape [1]): a dumped step's metric reads
        back like a saved step's."""
        array = self.to_numpy(value)
        return tuple(array.shape), array.dtype

    def on_prepared(self) -> None:
        """Hyperparameters and trees are always saved whole: drop reductions asked of them; the
        flight recorder keeps neither."""
        assert self.hook is not None
        for name in RAW_ONLY_COLLECTIONS:
            coll = self.hook.collection_manager.collections.get(name)
            if coll is not None:
                if coll.effective_reduction_config().items():
                    logger.warning("collection %s is always saved whole: its reductions are "
                                   "ignored", name)
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)
        recorder = self.hook.recorder
        if recorder is not None:  # saved whole at their own rounds: a ring of them tells nothing
            whole = sorted(c.name for c in recorder.collections if c.name in RAW_ONLY_COLLECTIONS)
            if whole and recorder.config.collections is not None:
                logger.warning("the flight recorder does not keep %s (always saved whole, at the "
                               "rounds their save config names)", ", ".join(whole))
            recorder.collections = frozenset(
                c for c in recorder.collections if c.name not in RAW_ONLY_COLLECTIONS)

    # -- the TrainingCallback events --------------------------------------------------------------
    def before_training(self) -> None:
        """A training starts: forget what was cached about the previous model."""
        self._model_info = None
        self._round_offset = None
        self._wanted_cache.clear()

    @guarded(default=False)
    def after_iteration(self, model: Any, epoch: int, evals_log: Mapping[str, Any]) -> bool:
        """Save this round as one step; True (XGBoost stops boosting) if a rule asked to stop."""
        hook = self.hook
        assert hook is not None
        rnd = self._round_of(model, epoch)
        if hook.step < 0 and self._hp_config is not None:
            hp = hook.collection_manager.collections.get(K.HYPERPARAMETERS)
            if hp is not None and hp.save_config is self._hp_config:
                self._hp_config.save_steps = [rnd]  # the first round, also when training resumed
        hook.begin_step(rnd)
        if hook.step_active and hook.writer is not None:  # no work for a worker that does not write
            due = hook.plan.due_for(hook.plan.saved)
            self._active = due + [c for c in self._named_for_recorder() if c not in due]
            self._save_round(model, evals_log)
        hook.end_step()
        return hook.stop_requested is not None

    @guarded()
    def after_training(self) -> None:
        """Make every saved round readable now; close the trial if a rule stopped training."""
        hook = self.hook
        assert hook is not None
        if hook.stop_requested is not None:
            logger.warning("training stopped on a rule's request: closing the trial")
            hook.close()
        else:
            hook.flush()

    def _round_of(self, model: Any, epoch: int) -> int:
        """The boosting round just done: the model's round count - 1 (equal to ``epoch`` unless
        training resumed from a saved model); after a previous run's steps if the hook is reused."""
        assert self.hook is not None
        step = self.hook.step
        known = self._round_offset
        if known is not None and known[0] is model:
            rnd = epoch + known[1]
        else:
            rounds = getattr(model, "num_boosted_rounds", None)
            rnd = rounds() - 1 if callable(rounds) else epoch
            self._round_offset = (model, rnd - epoch)
        if rnd <= step:
            self.warn_once("reused", "this hook already saved step %d; a new training run with "
                            "the same hook continues at step %d (use one hook per run to keep "
                            "step = boosting round)", step, step + 1)
            rnd = step + 1
        return rnd

    def _named_for_recorder(self) -> list[Collection]:
        """The collections named in ``FlightRecorderConfig(collections=...)``: computed every
        round (predictions, importance, SHAP cost a pass over the model). A recorder that records
        the saved collections (collections=None) keeps every round's metrics, which XGBoost
        computed anyway, and the rest on the rounds that save them."""
        recorder = self.hook.recorder if self.hook is not None else None
        if recorder is None or recorder.current is None or recorder.config.collections is None:
            return []
        return list(recorder.collections)

    # -- what a round saves -----------------------------------------------------------------------
    def _save(self, name: str, value: Any) -> None:
        assert self.hook is not None
        self.hook.save_for_tensor(name, value)

    def _save_round(self, model: Any, evals_log: Mapping[str, Any]) -> None:
        for name, value in (self._hyperparameters or {}).items():
            self._save(f"hyperparameters/{name}", value)
        if self._hyperparameters is None and self._wanted(K.HYPERPARAMETERS, lambda: ()):
            self.warn_once(K.HYPERPARAMETERS, "collection hyperparameters is saved but the hook "
                            "has none: pass Hook(hyperparameters=params)")
        for name, value in metric_values(evals_log):
            self._save(name, value)
        if not isinstance(model, xgb.Booster):
            if any(self._wanted(c, lambda: ()) for c in NEEDS_BOOSTER):
                self.warn_once("cv", "the model is a %s, not a Booster (xgb.cv?): only metrics, "
                                "losses and hyperparameters are saved", type(model).__name__)
            return
        self._save_validation(model)
        self._save_tree_collections(model)
        self._save_shap(model)

    def _save_validation(self, model: xgb.Booster) -> None:
        """Predictions on, and labels of, validation_data."""
        if (self._wanted(K.PREDICTIONS, lambda: ["predictions"])
                and self._needs(self._validation_data, "validation_data", K.PREDICTIONS)):
            self._save("predictions", model.predict(self._validation_data))
        if (self._wanted(K.LABELS, lambda: ["labels"])
                and self._needs(self._validation_data, "validation_data", K.LABELS)):
            if self._labels is None:
                self._labels = self._validation_data.get_label()  # type: ignore[union-attr]
            self._save("labels", self._labels)

    def _save_tree_collections(self, model: xgb.Booster) -> None:
        fi = self._wanted(K.FEATURE_IMPORTANCE, lambda: [
            f"feature_importance/{t}/{f}"
            for t in _model.IMPORTANCE_TYPES for f in self._info(model).feature_names])
        trees = self._wanted(K.TREES, lambda: [f"trees/{c}" for c in _model.TREE_COLUMNS])
        if not (fi or trees):
            return
        info = self._info(model)
        if not info.has_trees:
            self.warn_once("gblinear", "feature importance and trees exist for tree boosters "
                            "only, not %s: not saved", info.booster_type)
            return
        if fi:
            for kind in _model.IMPORTANCE_TYPES:
                for feature, value in _model.normalized_importance(model, kind).items():
                    self._save(f"feature_importance/{kind}/{feature}", value)
        if trees:
            for column, values in _model.round_trees(model, model.num_boosted_rounds() - 1).items():
                self._save(f"trees/{column}", values)

    def _save_shap(self, model: xgb.Booster) -> None:
        shap_columns = lambda: [*self._info(model).feature_names, "bias"]  # noqa: E731
        full = self._wanted(K.FULL_SHAP, lambda: [f"full_shap/{c}" for c in shap_columns()])
        average = self._wanted(K.AVERAGE_SHAP,
                               lambda: [f"average_shap/{c}" for c in shap_columns()])
        if not (full or average):
            return
        if not self._needs(self._train_data, "train_data", K.FULL_SHAP if full else K.AVERAGE_SHAP):
            return
        values = _model.shap_values(model, self._train_data)  # type: ignore[arg-type]
        columns = shap_columns()
        if values.shape[-1] != len(columns):
            self.warn_once("shap", "SHAP values have %d columns for %d features: not saved",
                            values.shape[-1], len(columns) - 1)
            return
        if full:
            for i, column in enumerate(columns):
                self._save(f"full_shap/{column}", np.ascontiguousarray(values[..., i]))
        if average:
            means = values.mean(axis=tuple(range(values.ndim - 1)))
            for i, column in enumerate(columns):
                self._save(f"average_shap/{column}", means[i])

    # -- helpers ----------------------------------------------------------------------------------
    def _wanted(self, group: str, names: Callable[[], Iterable[str]]) -> bool:
        """True if a collection due this round (or named for the flight recorder) holds tensors
        of ``group``: the group's own collection, or another such collection (``all``,
        ``default``, a user's) matching one of the group's possible ``names`` (cached per
        training: names only change with the model), so nothing is computed from the model for
        a collection that is not saved."""
        others = frozenset(c.name for c in self._active if c.name != group)
        if len(others) != len(self._active):
            return True
        if not others:
            return False
        key = (group, others)
        if key not in self._wanted_cache:
            colls = [c for c in self._active if c.name in others]
            self._wanted_cache[key] = any(c.matches(n) for n in names() for c in colls)
        return self._wanted_cache[key]

    def _needs(self, data: Any, arg: str, collection: str) -> bool:
        """True if ``data`` (the hook's ``arg``) was given; else warn once that ``collection``
        cannot be saved without it."""
        if data is not None:
            return True
        self.warn_once(arg, "collection %s is saved but the hook has no %s: pass Hook(%s=...)",
                        collection, arg, arg)
        return False

    def _info(self, model: xgb.Booster) -> _model.ModelInfo:
        """The model's facts, read once per model (the model is held, so its id is not reused)."""
        if self._model_info is None or self._model_info[0] is not model:
            self._model_info = (model, _model.ModelInfo(model))
        return self._model_info[1]



def metric_values(evals_log: Mapping[str, Any]) -> list[tuple[str, Any]]:
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
