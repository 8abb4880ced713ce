"""A small summary of a trial (collections, tensors, steps, statistics over steps, rule results,
the flight recorder's first non-finite tensor and dumps),
as a dict (logged as ``mltrace/summary.json``) and as one self-contained HTML page
(``summary.html``, which MLflow's artifact browser renders), so that a run's tensors show in the
MLflow UI. The statistics come from ``mltrace.analysis``, as the TensorBoard plugin's do.

The HTML has no script and no external resource: MLflow shows HTML artifacts in a sandboxed
iframe. Statistics over steps are drawn as inline SVG (mean line, min..max band).
"""

from __future__ import annotations

import html
import logging
import math
from typing import Any

from mltrace import analysis
from mltrace.exceptions import MltraceError
from mltrace.trials import Trial, create_trial

from . import flight_recorder
from .description import step_text

logger = logging.getLogger(__name__)

#: The statistics over steps a summary shows (each stored, else computed from the raw value).
STATS = ("mean", "std", "min", "max")


def _finite(x: float | None) -> float | None:
    """A value JSON can hold: NaN and infinities become None."""
    return x if x is not None and math.isfinite(x) else None


def _tensor_entry(
    trial: Trial, name: str, info: analysis.TrialOverview, max_steps: int
) -> dict[str, Any]:
    """One tensor of the summary: its collections, steps, last shape and statistics over steps."""
    tensor = trial.tensor(name)
    span = analysis.StepSpan.of(tensor.steps())
    # STATS where the raw value was saved; else (only reductions saved) the reductions stored.
    names = STATS if tensor.value_steps() else None
    series = analysis.tensor_series(trial, name, max_points=max_steps, names=names)
    shape = None
    if span.last is not None:
        try:
            shape = list(tensor.shape(span.last))
        except MltraceError:
            pass
    return {
        "name": name,
        "collections": info.collections_of(name),
        "steps": span.count,
        "first_step": span.first,
        "last_step": span.last,
        "shape": shape,
        "sampled_steps": series.steps,
        "stats": {k: [_finite(v) for v in vals] for k, vals in series.values.items()},
    }


def _rule_results(trial: Trial, latest: Any = None) -> list[dict[str, Any]]:
    """The rule results stored in the trial, oldest first, and ``latest`` (a RuleResult not
    stored yet: the execution that is ending) last."""
    try:
        from mltrace.rules.results import read_results

        stored = read_results(trial.storage)
        if latest is not None:
            stored = [r for r in stored if r.run_id != latest.run_id] + [latest]
        return [
            {
                "rule": r.rule,
                "status": r.status,
                "first_step": r.first_step,
                "first_step_text": None if r.first_step is None else step_text(trial, r.first_step),
                "message": r.message,
                "evaluated_steps": r.evaluated_steps,
                "mlflow_run_id": r.mlflow_run_id,
            }
            for r in stored
        ]
    except Exception as exc:  # the summary never fails for want of rule results
        logger.debug("no rule results in the summary: %s", exc)
        return []


def _global_span(trial: Trial, mode: str, span: analysis.StepSpan) -> dict[str, int | None]:
    """The global steps of a mode's first and last step (None where the trial cannot say)."""
    try:
        first = None if span.first is None else trial.global_step(mode, span.first)
        last = None if span.last is None else trial.global_step(mode, span.last)
    except MltraceError:
        first = last = None
    return {"global_first": first, "global_last": last}


def trial_summary(
    trial: Trial | str, max_tensors: int = 200, max_steps: int = 100, latest_rule: Any = None
) -> dict[str, Any]:
    """Describe a trial: modes and steps, collections, and for each tensor (at most
    ``max_tensors``) its steps, last shape and statistics over at most ``max_steps`` steps.

    Args:
        trial: a Trial or a trial path.
        max_tensors: tensors described (the first ones by name); the count of all is reported.
        max_steps: steps sampled per tensor for the statistics.
        latest_rule: a RuleResult not yet stored in the trial (a rule execution that is ending),
            shown with the stored ones.

    Returns:
        a JSON-ready dict.
    """
    if not isinstance(trial, Trial):
        trial = create_trial(trial, timeout=5)
    info = analysis.trial_overview(trial)
    collections = [
        {
            "name": name,
            "include_regex": list(coll.include_regex),
            "tensors": len(info.members[name]),
            "save_config": coll.effective_save_config().to_json_dict(),
        }
        for name, coll in info.collections.items()
    ]
    return {
        "trial": info.location,
        "workers": info.workers,
        "training_ended": info.ended,
        "modes": {name: {**span.to_dict(), **_global_span(trial, name, span)}
                  for name, span in info.modes.items()},
        "collections": collections,
        "tensor_count": len(info.tensors),
        "tensors": [_tensor_entry(trial, n, info, max_steps) for n in info.tensors[:max_tensors]],
        "rules": _rule_results(trial, latest_rule),
        "flight_recorder": flight_recorder.summary_entry(trial),
    }


# -- HTML ----------------------------------------------------------------------------------------
def _tick(v: float) -> str:
    """An axis label: 3 significant digits, exponent form for small and large magnitudes."""
    return f"{v:.3g}"


def _y_transform(values: list[float]) -> tuple[str, Any]:
    """("log", log10) when the values are positive and span two decades or more (1e-10 and 1e-2
    then stay apart), else ("linear", identity)."""
    if values and min(values) > 0 and max(values) / min(values) >= 100:
        return "log", math.log10
    return "linear", float


def _sparkline(
    steps: list[int], stats: dict[str, list[float | None]], width: int = 330, height: int = 96
) -> str:
    """Inline SVG of a statistic over global steps: the mean as a line, min..max as a band (or
    the first statistic stored), with its scale: the y axis labelled with its lowest and highest
    value (log scale when they span two decades: the labels then read 1e-10 where gradients
    vanish, which a bare line never tells) and the x axis with the first and last step."""
    line_stat = "mean" if "mean" in stats else next(iter(stats), None)
    if line_stat is None or not steps:
        return ""
    keys = [line_stat] + [k for k in ("min", "max") if k in stats]
    vals = [v for k in keys for v in stats[k] if v is not None]
    if not vals:
        return ""
    scale, f = _y_transform(vals)
    lo, hi = min(vals), max(vals)
    flo, fhi = f(lo), f(hi)
    span = (fhi - flo) or 1.0
    left, right, top, bottom = 64, 6, 6, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    x0, x1 = steps[0], steps[-1]
    xs = [left + (s - x0) / ((x1 - x0) or 1) * plot_w for s in steps]

    def y(v: float) -> float:
        return top + plot_h - (f(v) - flo) / span * plot_h

    axis = "#888"
    parts = [
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'xmlns="http://www.w3.org/2000/svg" role="img" font-family="sans-serif" font-size="10">',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="{axis}"/>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        f'stroke="{axis}"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{html.escape(_tick(hi))}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">{html.escape(_tick(lo))}'
        "</text>",
        f'<text x="{left}" y="{top + plot_h + 12}" text-anchor="start">{x0}</text>',
        f'<text x="{left + plot_w}" y="{top + plot_h + 12}" text-anchor="end">{x1}</text>',
        f'<text x="{left + plot_w / 2}" y="{height - 3}" text-anchor="middle" fill="#555">'
        f"global step; y: {html.escape(line_stat)}{' (log scale)' if scale == 'log' else ''}"
        "</text>",
    ]
    if "min" in stats and "max" in stats:
        pts = [(x, v) for x, v in zip(xs, stats["max"]) if v is not None]
        low = [(x, v) for x, v in zip(xs, stats["min"]) if v is not None]
        if pts and low:
            poly = " ".join(f"{x:.1f},{y(v):.1f}" for x, v in pts + low[::-1])
            parts.append(f'<polygon points="{poly}" fill="#cfe2f3" stroke="none"/>')
    line = " ".join(f"{x:.1f},{y(v):.1f}" for x, v in zip(xs, stats[line_stat]) if v is not None)
    parts.append(f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)


_ORDER = {"IssuesFound": 0, "Error": 1, "InProgress": 2, "NothingChecked": 3, "NoIssuesFound": 4}


def _findings_html(rules: list[dict[str, Any]]) -> list[str]:
    """The rule findings section: the latest execution of each rule, issues first, messages in
    full."""
    e = html.escape
    if not rules:
        return ["<h3>Rule findings</h3><p>No rule had run on this trial when this page was "
                "written (rules that run later update it, and the run's description).</p>"]
    latest: dict[str, dict[str, Any]] = {}
    for r in rules:  # oldest first: the last one of each rule wins
        latest[r["rule"]] = r
    rows = sorted(latest.values(), key=lambda r: (_ORDER.get(str(r["status"]), 9), r["rule"]))
    fired = sum(r["status"] == "IssuesFound" for r in rows)
    out = [f"<h3>Rule findings</h3><p>{fired} of {len(rows)} rules found issues.</p>",
           "<table><tr><th>rule</th><th>status</th><th>first found at</th><th>message</th>"
           "<th>steps checked</th></tr>"]
    for r in rows:
        colour = "#b00020" if r["status"] == "IssuesFound" else "#333"
        out.append(
            f"<tr><td>{e(r['rule'])}</td><td style='color:{colour};font-weight:bold'>"
            f"{e(str(r['status']))}</td><td>{e(r.get('first_step_text') or '-')}</td>"
            f"<td>{e(str(r.get('message') or '-'))}</td><td>{_fmt(r.get('evaluated_steps'))}</td>"
            "</tr>")
    out.append("</table>")
    return out


def _flight_recorder_html(entry: dict[str, Any] | None) -> list[str]:
    """The first non-finite tensor, prominently, and the flight recorder's dumps (nothing when
    the trial has neither)."""
    e = html.escape
    first = (entry or {}).get("first_nonfinite")
    dumps = (entry or {}).get("dumps") or []
    if not first and not dumps:
        return []
    out = ["<h3>Flight recorder</h3>"]
    if first:
        out.append(
            f"<p style='color:#b00020;font-weight:bold'>First non-finite tensor: "
            f"<code>{e(first['tensor'])}</code> at global step {first['step']} "
            f"({e(first['mode'])} {first['mode_step']}), worker {e(first['worker'])}, "
            f"{e(first['phase'])} pass</p>")
    if dumps:
        out.append("<table><tr><th>step</th><th>worker</th><th>trigger</th><th>reason</th>"
                   "<th>steps written before</th><th>steps after</th></tr>")
        for d in dumps:
            out.append(
                f"<tr><td>{d['step']}</td><td>{e(d['worker'])}</td><td>{e(d['trigger'])}</td>"
                f"<td>{e(d['reason'])}</td><td>{e(_steps_text(d['steps_before']))}</td>"
                f"<td>{e(_steps_text(d['steps_after']))}</td></tr>")
        out.append("</table>")
    return out


def _steps_text(steps: list[int]) -> str:
    """``first..last (n)`` of a sorted list of steps, ``-`` for none."""
    if not steps:
        return "-"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]} ({len(steps)})"


def log_summary(client: Any, run_id: str, trial: Trial | str,
                latest_rule: Any = None) -> dict[str, Any]:
    """Write the summary of ``trial`` into run ``run_id`` as ``mltrace/summary.html`` and
    ``mltrace/summary.json`` (again: a later call replaces them).

    Returns:
        the summary dict.
    """
    info = trial_summary(trial, latest_rule=latest_rule)
    client.log_text(run_id, summary_html(info), "mltrace/summary.html")
    client.log_dict(run_id, info, "mltrace/summary.json")
    return info


def _fmt(v: Any) -> str:
    return html.escape(analysis.format_statistic(v, digits=4))


def summary_html(info: dict[str, Any]) -> str:
    """One self-contained HTML page for a trial_summary() dict."""
    e = html.escape
    out = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>mltrace trial summary</title>",
        "<style>body{font-family:sans-serif;font-size:13px;margin:16px}table{border-collapse:collapse;"
        "margin-bottom:18px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;"
        "vertical-align:middle}th{background:#f4f4f4}code{font-size:12px}</style></head><body>",
        f"<h2>mltrace trial <code>{e(str(info['trial']))}</code></h2>",
        f"<p>workers: {e(', '.join(info['workers']))}; training ended: {info['training_ended']}; "
        f"{info['tensor_count']} tensors</p>",
    ]
    out += _flight_recorder_html(info.get("flight_recorder"))
    out += _findings_html(info.get("rules") or [])
    out.append("<h3>Steps</h3><p>Steps are global steps: every step the hook saw, in every mode "
               "(the x axis of the charts below, of mltrace's MLflow metrics and of its "
               "TensorBoard tab); a mode's own step counts that mode's steps only.</p>")
    out.append("<table><tr><th>mode</th><th>steps</th><th>global steps</th>"
               "<th>the mode's own steps</th></tr>")
    for mode, m in info["modes"].items():
        own = "-" if m["first"] is None else f"{m['first']}..{m['last']}"
        glob = "-" if m.get("global_first") is None else f"{m['global_first']}..{m['global_last']}"
        out.append(f"<tr><td>{e(mode)}</td><td>{m['steps']}</td><td>{glob}</td><td>{own}</td></tr>")
    out.append(
        "</table><h3>Collections</h3><table><tr><th>collection</th><th>include_regex</th>"
        "<th>tensors</th></tr>"
    )
    for c in info["collections"]:
        out.append(
            f"<tr><td>{e(c['name'])}</td><td><code>{e(', '.join(c['include_regex']))}</code></td>"
            f"<td>{c['tensors']}</td></tr>"
        )
    out.append("</table>")
    out.append(
        "<h3>Tensors</h3><table><tr><th>tensor</th><th>collections</th><th>steps</th>"
        "<th>shape</th><th>last mean</th><th>last min</th><th>last max</th>"
        "<th>over global steps (mean; band: min..max)</th></tr>"
    )
    for t in info["tensors"]:
        stats = t["stats"]
        last = {
            k: next((v for v in reversed(vals) if v is not None), None) for k, vals in stats.items()
        }
        span = (
            "-"
            if t["first_step"] is None
            else f"{t['steps']} ({t['first_step']}..{t['last_step']})"
        )
        out.append(
            f"<tr><td><code>{e(t['name'])}</code></td><td>{e(', '.join(t['collections']))}</td>"
            f"<td>{span}</td><td>{_fmt(t['shape'])}</td><td>{_fmt(last.get('mean'))}</td>"
            f"<td>{_fmt(last.get('min'))}</td><td>{_fmt(last.get('max'))}</td>"
            f"<td>{_sparkline(t['sampled_steps'], stats)}</td></tr>"
        )
    out.append("</table>")
    if info["tensor_count"] > len(info["tensors"]):
        out.append(f"<p>{info['tensor_count'] - len(info['tensors'])} more tensors not shown.</p>")
    out.append("</body></html>")
    return "\n".join(out)


__all__ = ["trial_summary", "summary_html"]
