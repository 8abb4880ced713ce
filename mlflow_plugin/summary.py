"""A small summary of a trial (collections, tensors, steps, statistics over steps, rule results),
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


def _rule_results(trial: Trial) -> list[dict[str, Any]]:
    try:
        from mltrace.rules.results import read_results

        return [
            {
                "rule": r.rule,
                "status": r.status,
                "first_step": r.first_step,
                "message": r.message,
                "evaluated_steps": r.evaluated_steps,
                "mlflow_run_id": r.mlflow_run_id,
            }
            for r in read_results(trial.storage)
        ]
    except Exception as exc:  # the summary never fails for want of rule results
        logger.debug("no rule results in the summary: %s", exc)
        return []


def trial_summary(
    trial: Trial | str, max_tensors: int = 200, max_steps: int = 100
) -> dict[str, Any]:
    """Describe a trial: modes and steps, collections, and for each tensor (at most
    ``max_tensors``) its steps, last shape and statistics over at most ``max_steps`` steps.

    Args:
        trial: a Trial or a trial path.
        max_tensors: tensors described (the first ones by name); the count of all is reported.
        max_steps: steps sampled per tensor for the statistics.

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
        "modes": {name: span.to_dict() for name, span in info.modes.items()},
        "collections": collections,
        "tensor_count": len(info.tensors),
        "tensors": [_tensor_entry(trial, n, info, max_steps) for n in info.tensors[:max_tensors]],
        "rules": _rule_results(trial),
    }


# -- HTML ----------------------------------------------------------------------------------------
def _sparkline(
    steps: list[int], stats: dict[str, list[float | None]], width: int = 260, height: int = 56
) -> str:
    """Inline SVG: mean over steps as a line, min..max as a band (or the first stat stored)."""
    line_stat = "mean" if "mean" in stats else next(iter(stats), None)
    if line_stat is None or not steps:
        return ""
    keys = [line_stat] + [k for k in ("min", "max") if k in stats]
    vals = [v for k in keys for v in stats[k] if v is not None]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    x0, x1 = steps[0], steps[-1]
    xs = [(s - x0) / ((x1 - x0) or 1) * (width - 4) + 2 for s in steps]

    def y(v: float) -> float:
        return height - 2 - (v - lo) / span * (height - 4)

    parts = [
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'xmlns="http://www.w3.org/2000/svg" role="img">'
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
    out.append("<table><tr><th>mode</th><th>steps</th><th>first</th><th>last</th></tr>")
    for mode, m in info["modes"].items():
        out.append(
            f"<tr><td>{e(mode)}</td><td>{m['steps']}</td><td>{_fmt(m['first'])}</td>"
            f"<td>{_fmt(m['last'])}</td></tr>"
        )
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
    if info.get("rules"):
        out.append(
            "<h3>Rules</h3><table><tr><th>rule</th><th>status</th><th>first step</th>"
            "<th>message</th></tr>"
        )
        for r in info["rules"]:
            out.append(
                f"<tr><td>{e(r['rule'])}</td><td>{e(str(r['status']))}</td>"
                f"<td>{_fmt(r['first_step'])}</td><td>{_fmt(r['message'])}</td></tr>"
            )
        out.append("</table>")
    out.append(
        "<h3>Tensors</h3><table><tr><th>tensor</th><th>collections</th><th>steps</th>"
        "<th>shape</th><th>last mean</th><th>last min</th><th>last max</th>"
        "<th>over steps (mean; min..max)</th></tr>"
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
