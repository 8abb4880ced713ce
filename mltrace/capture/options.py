"""The settings of a hook, in one validated object: the one definition of smdebug's hook
arguments that the four front doors share.

The front doors (``mltrace.pytorch.Hook``, the TensorFlow hooks, ``mltrace.mxnet.Hook``,
``mltrace.xgboost.Hook``) spell smdebug's constructor signatures out, so that ``help()`` and IDEs
show them, and hand what they were called with to :meth:`HookOptions.from_front_door` by name.
tests/shape/test_front_doors.py holds each signature to the fields here: the same names, in the
same order, with the same defaults and types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.config import ReductionConfig, SaveConfig, name_list
from mltrace.exceptions import MltraceValueError


@dataclass
class HookOptions:
    """What a hook saves, where, and how it behaves on errors.

    Attributes:
        out_dir: local directory (or URI of an installed storage backend) for the trial.
        export_tensorboard: also write TensorBoard summaries (scalars of losses and metrics,
            histograms of collections with save_histogram) to ``<out_dir>/tensorboard/<MODE>/``.
        tensorboard_dir: where TensorBoard summaries go (implies the export).
        dry_run: decide everything but write no file.
        reduction_config: default ReductionConfig of collections that set none.
        save_config: default SaveConfig (a SaveConfig, SaveConfigMode or {mode: SaveConfigMode}).
        include_regex: regexes added to the ``default`` collection, which is then saved.
        include_collections: names of collections to save (the default-saved ones are added).
        save_all: save every tensor the hook sees (collection ``all``).
        include_workers: "one" (only the chief writes) or "all".
        strict: raise instead of going on: an internal error of mltrace (which otherwise
            disables the hook), a file that could not be written (a TrialWriteError, from the
            next step boundary after the background write failed, or from ``close()``; without
            strict the failure is logged once and the next steps are written as usual), and a
            sink's error (otherwise logged once per sink). Files kept in the spill folder during
            an S3 outage are not errors.
        mlflow: log to MLflow too: True (the active run, or a new one), or a dict of options
            for the MLflow sink (``experiment``, ``run_name``, ``tracking_uri``, ``run_id``,
            ``system_metrics``: MLflow's CPU, memory and GPU utilization in the run).
        stop_check_interval: seconds between looks for a rule's stop signal (never per step).
        flight_recorder: keep the last steps of chosen collections in memory and write them
            when something goes wrong (a FlightRecorderConfig, a dict of its fields, or True
            for its defaults; see mltrace.capture.flight_recorder).
    """

    out_dir: str
    export_tensorboard: bool = False
    tensorboard_dir: str | None = None
    dry_run: bool = False
    reduction_config: ReductionConfig | None = None
    save_config: Any = None
    include_regex: str | Iterable[str] | None = None
    include_collections: Iterable[str] | None = None
    save_all: bool = False
    include_workers: str = "one"
    strict: bool = False
    mlflow: bool | dict[str, Any] | None = None
    stop_check_interval: float | None = None
    sinks: dict[str, Any] = field(default_factory=dict)
    flight_recorder: FlightRecorderConfig | dict[str, Any] | bool | None = None

    @classmethod
    def from_front_door(cls, arguments: Mapping[str, Any]) -> HookOptions:
        """The options of a front door's call, from its arguments by name (its ``locals()``):
        every argument that is a field here; ``saveall`` (Tornasole's spelling) turns
        ``save_all`` on; a missing ``out_dir`` is refused as for any hook. A front door's own
        arguments (PyTorch's ``step_boundary``, XGBoost's data) are left to it."""
        given = {f.name: arguments[f.name] for f in fields(cls) if f.name in arguments}
        given["out_dir"] = given.get("out_dir") or ""
        if arguments.get("saveall"):
            given["save_all"] = True
        return cls(**given)

    def __post_init__(self) -> None:
        if not self.out_dir:
            raise MltraceValueError("out_dir is required: the directory the trial is written to")
        if self.include_workers not in ("one", "all"):
            raise MltraceValueError(f"include_workers={self.include_workers!r} must be 'one' or 'all'")
        if self.reduction_config is not None and not isinstance(self.reduction_config, ReductionConfig):
            raise MltraceValueError(f"reduction_config={self.reduction_config!r} must be a ReductionConfig")
        if self.include_collections is not None:
            self.include_collections = name_list(
                "include_collections", self.include_collections, "collection name", "weights")
        self.dry_run, self.strict, self.save_all = bool(self.dry_run), bool(self.strict), bool(self.save_all)
        self.flight_recorder = FlightRecorderConfig.parse(self.flight_recorder)
        if self.mlflow and "mlflow" not in self.sinks:
            self.sinks["mlflow"] = {} if self.mlflow is True else dict(self.mlflow)

    def hook_save_config(self, default: SaveConfig | None) -> SaveConfig:
        """The hook's SaveConfig: the one given, else the adapter's default, else smdebug's."""
        if self.save_config is not None:
            return SaveConfig.parse(self.save_config)
        return default.copy() if default else SaveConfig()

    def hook_reduction_config(self) -> ReductionConfig:
        """The hook's ReductionConfig: the one given, else raw tensors only."""
        return self.reduction_config or ReductionConfig(save_raw_tensor=True)

    def included(self, default_include: Iterable[str], always: Iterable[str]) -> list[str]:
        """The saved collections' names: those given (else the adapter's defaults), then the
        ones an adapter always saves (smdebug: losses for PyTorch)."""
        names = list(default_include) if self.include_collections is None else list(self.include_collections)
        return names + list(always)

    def add_sink(self, name: str, options: dict[str, Any]) -> None:
        """Record a tracking sink added after the hook was built (``"mlflow"`` also sets mlflow=).

        Raises:
            MltraceValueError: the sink is there already.
        """
        if name in self.sinks:
            raise MltraceValueError(f"the hook logs to {name!r} already; add a sink once")
        self.sinks[name] = dict(options)
        if name == "mlflow":
            self.mlflow = dict(options) or True
