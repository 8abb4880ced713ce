"""The mltrace TensorBoard plugin: thin ``*_route`` methods (HTTP in, JSON out) over pure
``*_impl`` methods (trial in, dict out), as TensorBoard's own plugins are built.

Read-only. A run is named by the plugin (discovery.py) and looked up by that name only, a tensor
by a name the trial's index holds, and static files by a fixed list: nothing a request sends
becomes a path, so a crafted name answers 4xx and serves no file. Errors are JSON ``{"error"}``.

Routes (under /data/plugin/mltrace):
    /index.js, /static/*    the frontend (ES module + CSS, no build step, no CDN)
    /runs                   trials found: [{"name", "location"}]
    /run?run=R              modes, steps, workers, tensors by collection of one trial
    /overview?run=R[&collection=C or *][&statistic=l2][&mode=M][&columns=N][&filter=F][&worker=W]
              [&normalize=none|row|first|change]
                            one statistic of every tensor of a collection over step buckets,
                            rows in model order
    /difference?run=R&against=A[&collection=C][&statistic=l2][&mode=M][&columns=N][&filter=F]
                            R's statistic over A's at each step (ratios, the overview's shape)
                            and where the two runs part ways
    /series?run=R[&run=R2]&tensor=T[&mode=M][&worker=W|&per_worker=1][&max_points=N]
    /histograms?run=R&tensor=T&mode=M[&worker=W][&bins=30][&max_steps=N]
    /value?run=R&tensor=T&step=S&mode=M[&worker=W]
    /collections?run=R, /rules?run=R
    /diagnosis?run=R[&worker=W]  the trial's stored diagnosis, else one computed (cached, never
                            written into the trial): the overview marks its onset and origin

Steps: every answer gives global steps (the x axis of every chart, the TensorBoard export's and
the rules'), and mode steps beside them (``steps`` of a mode, ``start_modes``, ``mode_step``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tensorboard import errors
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from mltrace.analysis import heatmap
from mltrace.exceptions import MltraceError, MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.trials import Trial, create_trial

from . import diagnosis_view, discovery, metadata, overview, rules_view, views

logger = logging.getLogger(__name__)

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
#: Seconds a discovery result is reused (TensorBoard's own reload interval is 5 s).
DISCOVERY_TTL = 10.0
MAX_RUNS_PER_REQUEST = 16
MAX_BINS = 200


class MltracePlugin(base_plugin.TBPlugin):
    """Overview (with the diagnosis), Tensors, Collections and Rules panels over mltrace trials.

    Args:
        context: TensorBoard's TBContext (logdir, data_provider; each may be None).
        mltrace_logdirs: trials or folders of trials (``--mltrace_logdir``).
        mlflow_uri: base URL of the MLflow UI for rule-run links (``--mltrace_mlflow_uri``).
    """

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext, mltrace_logdirs: list[str] | None = None,
                 mlflow_uri: str | None = None) -> None:
        self._logdir = getattr(context, "logdir", None) or None
        self._provider = getattr(context, "data_provider", None)
        self._roots = list(mltrace_logdirs or [])
        self._mlflow_uri = mlflow_uri
        self._lock = threading.Lock()
        self._refs: dict[str, discovery.TrialRef] = {}
        self._refs_at = float("-inf")
        self._trials: dict[str, tuple[Trial, threading.RLock]] = {}
        self._cache = views.SeriesCache()
        self._statistics = heatmap.StatisticCache()
        self._diagnoses = diagnosis_view.DiagnosisCache()
        self._static = frozenset(n for n in os.listdir(STATIC_DIR)
                                 if os.path.splitext(n)[1] in _CONTENT_TYPES)

    # -- TensorBoard's plugin interface -----------------------------------------------------------
    def get_plugin_apps(self) -> dict[str, Callable]:
        routes: dict[str, Callable[[wrappers.Request], wrappers.Response]] = {
            "/index.js": self._index_js_route,
            "/static/*": self._static_route,
            "/runs": self._runs_route,
            "/run": self._run_route,
            "/overview": self._overview_route,
            "/difference": self._difference_route,
            "/series": self._series_route,
            "/histograms": self._histograms_route,
            "/value": self._value_route,
            "/collections": self._collections_route,
            "/rules": self._rules_route,
            "/diagnosis": self._diagnosis_route,
        }
        # Each route takes the request; werkzeug makes it a WSGI application.
        return {path: wrappers.Request.application(route) for path, route in routes.items()}

    def is_active(self) -> bool:
        try:
            return bool(self._discover())
        except Exception as exc:  # TensorBoard treats an exception as inactive anyway
            logger.warning("mltrace: trial discovery failed: %s", exc)
            return False

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name=metadata.TAB_NAME)

    # -- discovery and trials ---------------------------------------------------------------------
    def _discover(self, run_names: list[str] | None = None,
                  force: bool = False) -> dict[str, discovery.TrialRef]:
        with self._lock:
            if force or run_names or time.monotonic() - self._refs_at > DISCOVERY_TTL:
                refs = discovery.discover(self._roots, self._logdir, run_names or [])
                self._refs = {r.name: r for r in refs}
                self._refs_at = time.monotonic()
            return dict(self._refs)

    def _provider_runs(self, request: wrappers.Request) -> list[str]:
        if self._provider is None or not self._logdir:
            return []
        from tensorboard import plugin_util

        try:
            runs = self._provider.list_runs(plugin_util.context(request.environ),
                                            experiment_id=plugin_util.experiment_id(request.environ))
            return [r.run_name for r in runs]
        except Exception as exc:
            logger.debug("mltrace: list_runs failed: %s", exc)
            return []

    def trial(self, name: str) -> tuple[Trial, threading.RLock]:
        """The open trial shown as ``name`` (opened on first use, then kept and refreshed)."""
        ref = self._discover().get(name) if isinstance(name, str) else None
        if ref is None and time.monotonic() - self._refs_at > 2.0:  # a new trial may have appeared
            ref = self._discover(force=True).get(name)
        if ref is None:
            raise errors.NotFoundError(f"no trial named {name!r}; ask /runs for the names")
        with self._lock:
            entry = self._trials.get(ref.location)
            if entry is None:
                try:
                    trial = create_trial(ref.location, name=ref.name, timeout=0)
                except (MltraceError, OSError) as exc:
                    raise errors.NotFoundError(f"trial {name!r} cannot be read: {exc}") from None
                entry = self._trials[ref.location] = (trial, threading.RLock())
            return entry

    # -- impl: pure methods over trials (tests call them directly) ---------------------------------
    def runs_impl(self, run_names: list[str] | None = None) -> dict[str, Any]:
        refs = self._discover(run_names, force=run_names is not None)
        return {"version": metadata.API_VERSION,
                "runs": [{"name": r.name, "location": r.location} for r in refs.values()],
                "mlflow_uri": self._mlflow_uri}

    def run_impl(self, run: str) -> dict[str, Any]:
        trial, lock = self.trial(run)
        with lock:
            return views.run_summary(trial)

    def overview_impl(self, run: str, collection: str | None = None, statistic: str = "l2",
                      mode: ModeKeys | None = None, columns: int = heatmap.DEFAULT_COLUMNS,
                      pattern: str | None = None, worker: str | None = None,
                      normalize: str = "none") -> dict[str, Any]:
        trial, lock = self.trial(run)
        with lock:
            try:
                return overview.overview(trial, collection, statistic, mode, columns, pattern,
                                         self._statistics, worker=worker, how=normalize)
            except MltraceValueError as exc:
                raise errors.InvalidArgumentError(str(exc)) from None

    def difference_impl(self, run: str, against: str, collection: str | None = None,
                        statistic: str = "l2", mode: ModeKeys | None = None,
                        columns: int = heatmap.DEFAULT_COLUMNS,
                        pattern: str | None = None) -> dict[str, Any]:
        (trial, lock), (reference, other) = self.trial(run), self.trial(against)
        first, second = (lock, other) if run <= against else (other, lock)  # one order: no deadlock
        with first, second:
            try:
                return overview.difference(trial, reference, collection, statistic, mode, columns,
                                           pattern, self._statistics)
            except MltraceValueError as exc:
                raise errors.InvalidArgumentError(str(exc)) from None

    def series_impl(self, runs: list[str], tensor: str, mode: ModeKeys | None = None,
                    worker: str | None = None, per_worker: bool = False,
                    max_points: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"tensor": tensor, "runs": []}
        for run in runs:
            trial, lock = self.trial(run)
            with lock:
                self._check_tensor(trial, tensor, worker, required=len(runs) == 1)
                if not trial.has_tensor(tensor):
                    out["runs"].append({"run": trial.name, "missing": True, "modes": {}})
                    continue
                out["runs"].append(views.series(trial, tensor, [mode] if mode else None, worker,
                                                per_worker, self._cache, max_points))
        return out

    def histograms_impl(self, run: str, tensor: str, mode: ModeKeys, worker: str | None = None,
                        bins: int = views.DEFAULT_HISTOGRAM_BINS,
                        max_steps: int | None = None) -> dict[str, Any]:
        trial, lock = self.trial(run)
        with lock:
            self._check_tensor(trial, tensor, worker)
            return views.histograms(trial, tensor, mode, worker, bins, max_steps)

    def value_impl(self, run: str, tensor: str, step: int, mode: ModeKeys,
                   worker: str | None = None) -> dict[str, Any]:
        trial, lock = self.trial(run)
        with lock:
            self._check_tensor(trial, tensor, worker)
            try:
                return views.value_table(trial, tensor, step, mode, worker)
            except MltraceError as exc:
                raise errors.NotFoundError(str(exc)) from None

    def collections_impl(self, run: str) -> dict[str, Any]:
        trial, lock = self.trial(run)
        with lock:
            return views.collections(trial)

    def rules_impl(self, run: str) -> dict[str, Any]:
        trial, lock = self.trial(run)
        with lock:
            return rules_view.rules(trial, self._mlflow_uri, self._statistics,
                                    rules_view.NONFINITE_BUDGET_S)

    def diagnosis_impl(self, run: str, worker: str | None = None) -> dict[str, Any]:
        trial, lock = self.trial(run)
        return diagnosis_view.diagnosis(trial, lock, self._diagnoses, worker)

    @staticmethod
    def _check_tensor(trial: Trial, tensor: str, worker: str | None, required: bool = True) -> None:
        if not isinstance(tensor, str) or not tensor:
            raise errors.InvalidArgumentError("tensor is required")
        if required and not trial.has_tensor(tensor):
            raise errors.NotFoundError(f"trial {trial.name!r} has no tensor {tensor!r}")
        if worker is not None and worker not in trial.workers():
            raise errors.NotFoundError(f"trial {trial.name!r} has no worker {worker!r}")

    # -- routes: parse, call the impl, answer JSON ------------------------------------------------
    def _json(self, request: wrappers.Request,
              impl: Callable[[], dict[str, Any]]) -> wrappers.Response:
        try:
            body: Any = impl()
            try:  # encoded here when it holds no NaN: TensorBoard's cleansing walks every value
                body = json.dumps(body, allow_nan=False)
            except (ValueError, TypeError):
                pass  # NaN, infinities, bytes: TensorBoard's Respond cleanses them
            return http_util.Respond(request, body, "application/json")
        except errors.PublicError as exc:
            return http_util.Respond(request, {"error": str(exc)}, "application/json",
                                     code=exc.http_code)
        except MltraceError as exc:
            return http_util.Respond(request, {"error": str(exc)}, "application/json", code=404)

    def _runs_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.runs_impl(self._provider_runs(request) or None))

    def _run_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.run_impl(_arg(request, "run")))

    def _overview_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.overview_impl(
            _arg(request, "run"), request.args.get("collection"),
            request.args.get("statistic") or "l2", _optional_mode(request),
            _int(request, "columns", minimum=1, maximum=heatmap.MAX_COLUMNS)
            or heatmap.DEFAULT_COLUMNS,
            request.args.get("filter") or None, request.args.get("worker") or None,
            request.args.get("normalize") or "none"))

    def _difference_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.difference_impl(
            _arg(request, "run"), _arg(request, "against"), request.args.get("collection"),
            request.args.get("statistic") or "l2", _optional_mode(request),
            _int(request, "columns", minimum=1, maximum=heatmap.MAX_COLUMNS)
            or heatmap.DEFAULT_COLUMNS, request.args.get("filter") or None))

    def _series_route(self, request: wrappers.Request) -> wrappers.Response:
        def impl() -> dict[str, Any]:
            runs = request.args.getlist("run")
            if not runs or len(runs) > MAX_RUNS_PER_REQUEST:
                raise errors.InvalidArgumentError(
                    f"give 1 to {MAX_RUNS_PER_REQUEST} run= parameters")
            return self.series_impl(runs, _arg(request, "tensor"), _optional_mode(request),
                                    request.args.get("worker") or None,
                                    request.args.get("per_worker") in ("1", "true"),
                                    _int(request, "max_points", minimum=2))
        return self._json(request, impl)

    def _histograms_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.histograms_impl(
            _arg(request, "run"), _arg(request, "tensor"), _mode(request),
            request.args.get("worker") or None,
            _int(request, "bins", minimum=1, maximum=MAX_BINS) or views.DEFAULT_HISTOGRAM_BINS,
            _int(request, "max_steps", minimum=1)))

    def _value_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.value_impl(
            _arg(request, "run"), _arg(request, "tensor"),
            _required_int(request, "step", minimum=0),
            _mode(request), request.args.get("worker") or None))

    def _collections_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.collections_impl(_arg(request, "run")))

    def _rules_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.rules_impl(_arg(request, "run")))

    def _diagnosis_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._json(request, lambda: self.diagnosis_impl(
            _arg(request, "run"), request.args.get("worker") or None))

    def _index_js_route(self, request: wrappers.Request) -> wrappers.Response:
        return self._serve_file(request, "index.js")

    def _static_route(self, request: wrappers.Request) -> wrappers.Response:
        _, _, name = request.path.partition(f"/{metadata.PLUGIN_NAME}/static/")
        return self._serve_file(request, name)

    def _serve_file(self, request: wrappers.Request, name: str) -> wrappers.Response:
        # A fixed list: "..", "%2e%2e", "\\" and absolute paths never match.
        if name not in self._static:
            return http_util.Respond(request, "not found", "text/plain", code=404)
        with open(os.path.join(STATIC_DIR, name), "rb") as f:
            content = f.read()
        return http_util.Respond(request, content, _CONTENT_TYPES[os.path.splitext(name)[1]])


def _arg(request: wrappers.Request, name: str) -> str:
    value = request.args.get(name)
    if not value:
        raise errors.InvalidArgumentError(f"parameter {name}= is required")
    return value


def _optional_mode(request: wrappers.Request) -> ModeKeys | None:
    """The ``mode=`` parameter (any case), None when absent."""
    raw = request.args.get("mode")
    if not raw:
        return None
    if raw.upper() not in ModeKeys.__members__:
        raise errors.InvalidArgumentError(
            f"mode={raw!r} is not one of {[m.name for m in ModeKeys]}")
    return ModeKeys[raw.upper()]


def _mode(request: wrappers.Request) -> ModeKeys:
    """The ``mode=`` parameter, which the route requires."""
    mode = _optional_mode(request)
    if mode is None:
        raise errors.InvalidArgumentError(
            f"parameter mode= is required: one of {[m.name for m in ModeKeys]}")
    return mode


def _int(request: wrappers.Request, name: str, minimum: int = 0,
         maximum: int | None = None) -> int | None:
    """The integer parameter ``name`` within [minimum, maximum], None when absent."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgumentError(f"{name}={raw!r} is not an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise errors.InvalidArgumentError(
            f"{name}={value} is out of range [{minimum}, {maximum or 'inf'}]")
    return value


def _required_int(request: wrappers.Request, name: str, minimum: int = 0) -> int:
    """The integer parameter ``name`` (>= minimum), which the route requires."""
    value = _int(request, name, minimum)
    if value is None:
        raise errors.InvalidArgumentError(f"parameter {name}= is required")
    return value
