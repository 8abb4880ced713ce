"""Collections: named groups of tensors, each with its own save and reduction configs.

A tensor belongs to a collection if its name is in ``tensor_names`` or matches one of
``include_regex`` anywhere (``re.search``, as smdebug). The collections file of a trial is the
CollectionManager's JSON (smdebug's schema, plus the extra key ``mltrace_reductions``, which
smdebug's loader ignores inside a collection entry).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mltrace.config import EXTRA_REDUCTIONS_KEY, ReductionConfig, SaveConfig
from mltrace.exceptions import MltraceValueError

logger = logging.getLogger(__name__)


class CollectionKeys:
    """Built-in collection names (smdebug's)."""

    DEFAULT = "default"
    ALL = "all"
    INPUTS = "inputs"
    OUTPUTS = "outputs"
    WEIGHTS = "weights"
    GRADIENTS = "gradients"
    LOSSES = "losses"
    BIASES = "biases"
    LAYERS = "layers"
    SM_METRICS = "sm_metrics"
    OPTIMIZER_VARIABLES = "optimizer_variables"
    TENSORFLOW_SUMMARIES = "tensorflow_summaries"
    METRICS = "metrics"
    HYPERPARAMETERS = "hyperparameters"
    PREDICTIONS = "predictions"
    LABELS = "labels"
    FEATURE_IMPORTANCE = "feature_importance"
    AVERAGE_SHAP = "average_shap"
    FULL_SHAP = "full_shap"
    TREES = "trees"


#: Collections of scalars: never reduced, never histogrammed, always saved raw.
SCALAR_COLLECTIONS = frozenset({
    CollectionKeys.LOSSES, CollectionKeys.METRICS, CollectionKeys.FEATURE_IMPORTANCE,
    CollectionKeys.AVERAGE_SHAP, CollectionKeys.SM_METRICS,
})
NON_REDUCTION_COLLECTIONS = SCALAR_COLLECTIONS | {CollectionKeys.TENSORFLOW_SUMMARIES}
#: Collections whose scalars also go to the tracking sink (SageMaker Metrics in smdebug, MLflow here).
METRIC_COLLECTIONS = frozenset({CollectionKeys.LOSSES, CollectionKeys.METRICS, CollectionKeys.SM_METRICS})
#: Not saved outside TRAIN (no gradients exist in EVAL/PREDICT).
TRAIN_ONLY_COLLECTIONS = frozenset({CollectionKeys.GRADIENTS, CollectionKeys.OPTIMIZER_VARIABLES})


def _regex_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None or value is False:
        return []
    if not isinstance(value, (str, Iterable)) or isinstance(value, (bytes, bytearray, Mapping)):
        raise MltraceValueError(
            f"include_regex={value!r} must be a regex string or a list of them, e.g. 'fc1.*'")
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        try:
            re.compile(item)
        except (re.error, TypeError) as exc:
            raise MltraceValueError(
                f"include_regex {item!r} is not a valid regular expression ({exc}); "
                "escape special characters, e.g. re.escape('fc1.weight')"
            ) from None
    return items


def _name_set(value: str | Iterable[str] | None) -> set[str]:
    """Exact tensor names: one name or a list of them (a bare string is one name, not a set of
    its characters)."""
    if value is None:
        return set()
    if isinstance(value, str):
        return {value}
    if not isinstance(value, Iterable) or isinstance(value, (bytes, bytearray, Mapping)):
        raise MltraceValueError(f"tensor_names={value!r} must be a list of tensor names, e.g. ['loss']")
    names = set(value)
    if not all(isinstance(n, str) for n in names):  # e.g. a damaged collections file
        raise MltraceValueError(f"tensor_names={value!r} must hold strings only, e.g. ['loss']")
    return names


class Collection:
    """A named group of tensors.

    Args:
        name: the collection's name.
        include_regex: regexes; a tensor whose name matches any (re.search) belongs.
        tensor_names: exact names that belong.
        reduction_config: overrides the hook's ReductionConfig for these tensors.
        save_config: overrides the hook's SaveConfig for these tensors.
        save_histogram: export TensorBoard histograms of these tensors.
    """

    def __init__(
        self,
        name: str,
        include_regex: str | Iterable[str] | None = None,
        tensor_names: Iterable[str] | None = None,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | Any = None,
        save_histogram: bool = True,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise MltraceValueError(f"collection name {name!r} must be a non-empty string")
        self.name = name
        self._include_regex: list[str] = []
        self._compiled: list[re.Pattern[str]] = []
        self.include(_regex_list(include_regex))
        self._tensor_names: set[str] = _name_set(tensor_names)
        self._reduction_config = reduction_config
        self._save_config = None if save_config is None else SaveConfig.parse(save_config)
        self.save_histogram = save_histogram
        #: The hook's configs, used (as copies) when this collection sets none of its own.
        self._inherited_save_config: SaveConfig | None = None
        self._inherited_reduction_config: ReductionConfig | None = None

    # -- membership -----------------------------------------------------------------------------
    def include(self, regex: str | Iterable[str]) -> None:
        """Add one regex or a list of regexes."""
        for item in _regex_list(regex):
            if item not in self._include_regex:
                self._include_regex.append(item)
                self._compiled.append(re.compile(item))

    @property
    def include_regex(self) -> list[str]:
        """The include regexes (a list; assign a list or a string to replace them)."""
        return self._include_regex

    @include_regex.setter
    def include_regex(self, value: str | Iterable[str] | None) -> None:
        regexes = _regex_list(value)  # validate before replacing anything
        self._include_regex, self._compiled = [], []
        self.include(regexes)

    @property
    def tensor_names(self) -> set[str]:
        """Exact tensor names in this collection."""
        return self._tensor_names

    @tensor_names.setter
    def tensor_names(self, value: Iterable[str]) -> None:
        self._tensor_names = _name_set(value)

    def add_tensor_name(self, name: str) -> None:
        """Add one exact tensor name."""
        self._tensor_names.add(name)

    def remove_tensor_name(self, name: str) -> None:
        """Remove one exact tensor name (no error if absent)."""
        self._tensor_names.discard(name)

    def has_tensor_name(self, name: str) -> bool:
        """True if ``name`` was added by name (or recorded when it matched a regex)."""
        return name in self._tensor_names

    def matches(self, name: str) -> bool:
        """True if the tensor ``name`` belongs to this collection."""
        return name in self._tensor_names or any(p.search(name) for p in self._compiled)

    # -- configs --------------------------------------------------------------------------------
    @property
    def save_config(self) -> SaveConfig:
        """This collection's SaveConfig. Reading it before setting one gives this collection its
        own copy of the hook's, so ``coll.save_config.end_step = 0`` changes this collection only."""
        if self._save_config is None:
            base = self._inherited_save_config
            self._save_config = base.copy() if base is not None else SaveConfig()
        return self._save_config

    @save_config.setter
    def save_config(self, value: Any) -> None:
        self._save_config = None if value is None else SaveConfig.parse(value)

    def inherit(self, save_config: SaveConfig | None, reduction_config: ReductionConfig | None) -> None:
        """Use the hook's ``save_config`` and ``reduction_config`` where this collection sets none
        of its own (the hook calls this for each of its collections)."""
        self._inherited_save_config = save_config
        self._inherited_reduction_config = reduction_config

    def has_own_save_config(self) -> bool:
        """True once a SaveConfig was set on (or read from) this collection."""
        return self._save_config is not None

    def effective_save_config(self) -> SaveConfig:
        """The config in force: this collection's, else the hook's, else the default."""
        if self._save_config is not None:
            return self._save_config
        return self._inherited_save_config or SaveConfig()

    @property
    def reduction_config(self) -> ReductionConfig | None:
        """This collection's ReductionConfig, or None to use the hook's."""
        return self._reduction_config

    @reduction_config.setter
    def reduction_config(self, value: ReductionConfig | None) -> None:
        if value is not None and not isinstance(value, ReductionConfig):
            raise MltraceValueError(f"reduction_config={value!r} must be a ReductionConfig or None")
        self._reduction_config = value

    def effective_reduction_config(self) -> ReductionConfig:
        """The ReductionConfig in force for this collection's tensors."""
        if self._reduction_config is not None:
            return self._reduction_config
        return self._inherited_reduction_config or ReductionConfig(save_raw_tensor=True)

    # -- serialization --------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        """smdebug's collection entry, with the configs in force filled in."""
        reduction = self.effective_reduction_config()
        out: dict[str, Any] = {
            "name": self.name,
            "include_regex": list(self._include_regex),
            "tensor_names": sorted(self._tensor_names),
            "reduction_config": reduction.to_json_dict(),
            "save_config": self.effective_save_config().to_json_dict(),
            "save_histogram": self.save_histogram,
        }
        extra = reduction.extra_reductions_string()
        if extra:
            out[EXTRA_REDUCTIONS_KEY] = extra
        return out

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]) -> Collection:
        """Parse a collection entry of a collections file."""
        if not isinstance(params, Mapping) or "name" not in params:
            raise MltraceValueError(f"collection entry {params!r} must be a dict with a name")
        reduction = params.get("reduction_config")
        return cls(
            name=params["name"],
            include_regex=params.get("include_regex") or [],
            tensor_names=params.get("tensor_names") or [],
            reduction_config=ReductionConfig.from_dict(reduction, params.get(EXTRA_REDUCTIONS_KEY))
            if reduction is not None else None,
            save_config=_written_save_config(params["name"], params.get("save_config")),
            save_histogram=bool(params.get("save_histogram", True)),
        )

    def to_json(self) -> str:
        """smdebug's ``to_json``: ``to_json_dict()`` as JSON text (the configs in force filled
        in); smdebug's ``Collection.from_json`` reads it, and ``from_json`` gives back an equal
        collection."""
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json(cls, json_str: str | bytes) -> Collection:
        """smdebug's ``from_json``: the inverse of ``to_json``; reads smdebug's JSON too.

        Raises:
            MltraceValueError: not JSON, or not a collection entry.
        """
        try:
            params = json.loads(json_str)
        except (TypeError, ValueError) as exc:
            raise MltraceValueError(f"Collection.from_json: not JSON text ({exc}): pass the "
                                    "string Collection.to_json() returned") from None
        return cls.from_dict(params)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Collection) and self.to_json_dict() == other.to_json_dict()

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<Collection {self.name}: include_regex={self._include_regex}, tensor_names={sorted(self._tensor_names)[:5]}>"


def _written_save_config(name: str, params: Any) -> SaveConfig | None:
    """A collection's save config as a collections file holds it. Hooks check save configs
    when they are set; a file written elsewhere (smdebug accepted end_step == start_step) may
    hold one mltrace would refuse, which must not make the trial unreadable: reading needs no
    save config, so such a one is replaced by the default, with a warning. None when the file
    holds none (the collection then inherits the hook's)."""
    try:
        return SaveConfig.from_dict(params)
    except MltraceValueError as exc:
        logger.warning("collection %r: its save_config in the collections file is not one mltrace "
                       "accepts (%s); reading the trial does not need it, the default is shown", name, exc)
        return SaveConfig()


class CollectionManager:
    """The collections of a hook or a trial, by name.

    Args:
        collection_class: the class get() creates (adapters add framework methods, e.g.
            PyTorch's add_module_tensors).
    """

    def __init__(self, collection_class: type[Collection] = Collection) -> None:
        self.collection_class = collection_class
        self.collections: dict[str, Collection] = {}
        self.num_workers = 1

    def get(self, name: str, create: bool = True) -> Collection:
        """The collection ``name``; created empty if missing and ``create``."""
        if name not in self.collections:
            if not create:
                raise KeyError(f"collection {name!r} does not exist; known: {sorted(self.collections)}")
            self.collections[name] = self.collection_class(name)
        return self.collections[name]

    def add(self, collection: Collection) -> None:
        """Add (or replace) a collection."""
        if not isinstance(collection, Collection):
            raise MltraceValueError(f"{collection!r} is not a Collection")
        self.collections[collection.name] = collection

    def get_collections(self) -> dict[str, Collection]:
        """All collections by name."""
        return self.collections

    def to_json_dict(self) -> dict[str, Any]:
        """The collections file's content."""
        return {
            "collections": {n: c.to_json_dict() for n, c in self.collections.items()},
            "_meta": {"num_workers": self.num_workers},
        }

    def to_json(self) -> str:
        """The collections file's content as JSON text."""
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "collections file") -> CollectionManager:
        """Parse a collections file (smdebug's or mltrace's).

        Raises:
            MltraceValueError: not JSON, or not shaped like a collections file.
        """
        try:
            doc = json.loads(text)
            manager = cls()
            for entry in doc["collections"].values():
                manager.add(Collection.from_dict(entry))
            manager.num_workers = int((doc.get("_meta") or {}).get("num_workers", 1))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError,
                RecursionError) as exc:
            raise MltraceValueError(
                f"{where} is not a valid collections file ({type(exc).__name__}: {exc}); "
                "it may be damaged: restore it from the training job's output"
            ) from None
        return manager


#: The name prefix of a parameter's gradient in the PyTorch and MXNet hooks ("gradient/<param>").
GRADIENT_PREFIX = "gradient/"
#: The collections TornasoleHook saved by default (weights, biases and gradients).
TORNASOLE_INCLUDE_COLLECTIONS = [CollectionKeys.WEIGHTS, CollectionKeys.BIASES,
                                 CollectionKeys.GRADIENTS]


def parameter_collection_regexes(losses_regex: str) -> dict[str, list[str]]:
    """smdebug's default collections of a framework whose hook names gradients
    ``gradient/<param>`` (PyTorch, MXNet): {collection name: include regexes}. Only the losses
    regex differs between the two, as it does in smdebug."""
    return {
        CollectionKeys.ALL: [],
        CollectionKeys.DEFAULT: [],
        CollectionKeys.WEIGHTS: [f"^(?!{GRADIENT_PREFIX[:-1]}).*weight"],
        CollectionKeys.BIASES: [f"^(?!{GRADIENT_PREFIX[:-1]}).*bias"],
        CollectionKeys.GRADIENTS: [f"^{GRADIENT_PREFIX[:-1]}"],
        CollectionKeys.LOSSES: [losses_regex],
    }


def manager_with_defaults(defaults: Mapping[str, str | Iterable[str]],
                          collection_class: type[Collection] = Collection) -> CollectionManager:
    """A CollectionManager holding an adapter's default collections ({name: include regexes})."""
    manager = CollectionManager(collection_class=collection_class)
    for name, regexes in defaults.items():
        manager.get(name).include(regexes)
    return manager


class PendingCollections:
    """Collections configured through an adapter's module-level ``get_collection`` before any
    hook exists (Tornasole's PyTorch README does this); the next hook created takes them, and a fresh set from
    ``factory`` takes their place.

    Args:
        factory: builds the adapter's manager with its default collections.
    """

    def __init__(self, factory: Callable[[], CollectionManager]) -> None:
        self._factory = factory
        self._manager = factory()

    def get(self, name: str, create: bool = True) -> Collection:
        """A pending collection (created if missing and ``create``)."""
        return self._manager.get(name, create)

    def of(self, hook: Any, hook_type: type[Any], name: str, create: bool = True) -> Collection:
        """What an adapter's module-level ``get_collection(name)`` returns: the collection of
        ``hook`` while it is an open hook of the adapter (``hook_type``), else the pending one."""
        if isinstance(hook, hook_type) and not hook.closed:
            return hook.get_collection(name, create)
        return self.get(name, create)

    def take(self) -> CollectionManager:
        """Hand the pending collections to a new hook."""
        manager, self._manager = self._manager, self._factory()
        return manager
