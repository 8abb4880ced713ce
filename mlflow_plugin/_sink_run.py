"""The MLflow run of a hook's sink: which run it logs into, the run's tags and params, its end.

Which run: ``run_id`` if given; else the active run (``with mlflow.start_run():`` around the
hook); else a new run, made active on the creating thread so that the user's own
``mlflow.log_*`` calls and autologging land in it too. With ``nested=True`` and an active run, a
child run. A run the sink started, it ends at close (FAILED when the sink could not be set up);
a run it joined keeps its status. A run file in the trial records run id, experiment id and
tracking URI (rules find their parent there).

Tags: ``mltrace.trial``, ``mltrace.framework``, ``mltrace.version``, ``mltrace.run_type``.
Params: the hook's configuration as ``mltrace.*``, taken once its collections are fixed; a param
the run already has with another value stays (MLflow params cannot change).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mltrace import __version__

from . import _keys, _system_metrics, _tracking, links

#: The sink's logger, whichever of its parts logs.
logger = logging.getLogger("mltrace_mlflow.sink")


def _compact(save_config: dict[str, Any]) -> dict[str, Any]:
    """A SaveConfig's JSON with one entry instead of four when every mode is configured alike."""
    values = list(save_config.values())
    return values[0] if values and all(v == values[0] for v in values) else save_config


class RunLifecycle:
    """MlflowSink's part that opens (or joins), tags, configures and ends the run."""

    hook: Any
    options: dict[str, Any]
    client: Any
    tracking_uri: str
    run_id: str
    experiment_id: str
    trial: str
    _fluent: bool
    #: how the sink owns the run: "fluent" (mlflow.start_run), "client" (create_run) or None
    _owned: str | None
    #: the hook's configuration as params; None until the hook is prepared
    _params: dict[str, str] | None
    _params_logged: bool

    def _open_run(self, mlflow: Any) -> tuple[str, str, str | None]:
        """(run id, experiment id, how we own it: "fluent", "client" or None)."""
        opts = self.options
        if opts.get("run_id"):
            run = self.client.get_run(str(opts["run_id"]))
            return run.info.run_id, run.info.experiment_id, None
        active = mlflow.active_run() if self._fluent else None
        if active is not None and not opts.get("nested"):
            if opts.get("experiment") or opts.get("experiment_id") or opts.get("run_name"):
                logger.warning("an MLflow run is active (%s): the hook logs into it; its "
                               "experiment/run_name options apply to new runs only (nested=True "
                               "starts a child)", active.info.run_id)
            return active.info.run_id, active.info.experiment_id, None
        exp = _tracking.experiment_id_for(
            self.client, opts.get("experiment"), opts.get("experiment_id"),
            fluent_store=self._fluent)
        if active is not None and not (opts.get("experiment") or opts.get("experiment_id")):
            exp = active.info.experiment_id
        tags = {str(k): _keys.tag_value(v) for k, v in (opts.get("tags") or {}).items()}
        name = opts.get("run_name")
        if self._fluent:
            # System metrics of a run we start come from our own monitor (see _system_metrics):
            # False keeps MLflow's global switch from starting a second one.
            run = mlflow.start_run(experiment_id=exp, run_name=name, nested=active is not None,
                                   tags=tags,
                                   log_system_metrics=False if _system_metrics.wanted(opts) else None)
            return run.info.run_id, run.info.experiment_id, "fluent"
        from mlflow.tracking.context.registry import resolve_tags

        run = self.client.create_run(exp, run_name=name, tags=resolve_tags(tags))
        return run.info.run_id, run.info.experiment_id, "client"

    def _tag_run_and_trial(self) -> bool:
        """Tag the run, write the run file into the trial; True if autologging made the run."""
        module = type(self.hook).__module__.split(".")
        framework = module[1] if len(module) > 1 and module[0] == "mltrace" else module[0]
        self._set_tags({
            _keys.TAG_TRIAL: self.trial,
            _keys.TAG_VERSION: __version__,
            _keys.TAG_FRAMEWORK: framework,
            _keys.TAG_RUN_TYPE: "training",
        })
        run = self.client.get_run(self.run_id)
        _tracking.write_run_file(self.hook.storage, _tracking.RunFile(
            run_id=self.run_id, experiment_id=self.experiment_id, tracking_uri=self.tracking_uri,
            artifact_uri=run.info.artifact_uri))
        return "mlflow.autologging" in run.data.tags

    def _set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(_keys.clean_key(k), _keys.tag_value(v)) for k, v in tags.items()]
        for chunk in _keys.chunks(items, _keys.MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=chunk, synchronous=True)

    def _end_run(self, status: str = "FINISHED") -> None:
        """End the run if the sink started it (a joined run keeps its status); never raises."""
        if self._owned is None:
            return
        try:
            if self._owned == "fluent":
                import mlflow

                active = mlflow.active_run()
                if active is not None and active.info.run_id == self.run_id:
                    links.end_run(self.client, self.run_id, status,
                                  end=lambda: mlflow.end_run(status))
                    return
            links.end_run(self.client, self.run_id, status)
        except Exception as exc:
            logger.warning("could not end MLflow run %s: %s", self.run_id, exc)

    # -- params -----------------------------------------------------------------------------------
    def _safe_hook_params(self) -> dict[str, str]:
        try:
            return self._hook_params()
        except Exception as exc:  # a hook of another shape: no params, never a failed step
            logger.warning("the hook configuration is not logged as MLflow params: %s", exc)
            return {}

    def _hook_params(self) -> dict[str, str]:
        """The hook's configuration as params (taken once, after its collections are fixed)."""
        hook = self.hook
        hook_save = _compact(hook.save_config.to_json_dict())
        out = {
            "mltrace.include_collections": json.dumps(list(hook.include_collections)),
            "mltrace.save_config": json.dumps(hook_save, sort_keys=True),
            "mltrace.reduction_config": json.dumps(hook.reduction_config.to_json_dict(),
                                                   sort_keys=True),
            "mltrace.save_all": str(hook.save_all),
            "mltrace.include_workers": hook.include_workers,
        }
        for coll in hook.plan.saved:
            entry: dict[str, Any] = {"include_regex": list(coll.include_regex)}
            save = _compact(coll.effective_save_config().to_json_dict())
            if save != hook_save:
                entry["save_config"] = save
            if coll.reduction_config is not None and coll.reduction_config != hook.reduction_config:
                entry["reduction_config"] = coll.reduction_config.to_json_dict()
            out[f"mltrace.collection.{coll.name}"] = json.dumps(entry, sort_keys=True)
        return {_keys.clean_key(k): _keys.param_value(v) for k, v in out.items()}

    def _log_params_once(self) -> None:
        """Log the params, once they are known, unless ``log_params=False``."""
        if self._params and not self._params_logged and self.options.get("log_params", True):
            self._params_logged = True
            self._log_params(self._params)

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = []
        for key, value in params.items():
            if key in existing:
                if existing[key] != value:
                    logger.warning("run %s already has param %s=%r; mltrace's value %r is not "
                                   "logged (MLflow params cannot change)", self.run_id, key,
                                   existing[key], value)
                continue
            fresh.append(Param(key, value))
        for chunk in _keys.chunks(fresh, _keys.MAX_PARAMS_TAGS_PER_BATCH):
            try:
                self.client.log_batch(self.run_id, params=chunk, synchronous=True)
            except Exception as exc:
                logger.warning("could not log the hook configuration as params: %s", exc)
