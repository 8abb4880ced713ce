"""Plots of the SageMaker Debugger tensor-analysis notebook, from trials: how tensor distributions move over steps (animated
GIF), and two trials side by side (PNG, or GIF). matplotlib is imported inside each function
(Agg canvas, no pyplot: nothing changes the user's backend); GIFs are assembled with Pillow.

Example:
    >>> from mltrace_mlflow.plots import plot_distributions, compare_trials
    >>> plot_distributions("/tmp/run", ".*gradient", "gradients.gif")
    >>> compare_trials("/tmp/bad", "/tmp/good", ["gradient/Net_conv1.weight"], "cmp.png",
    ...                labels=("bad init", "good init"))

The notebook's helper is here too: ``create_interactive_matplotlib_histogram(tensors, filename)``
with ``tensors = {name: {step: array}}`` (what its custom rules collect).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mltrace import analysis
from mltrace.analysis import finite_values
from mltrace.exceptions import MltraceError, MltraceValueError
from mltrace.modes import ModeKeys, mode_from
from mltrace.trials import Trial, create_trial

from .series_plots import COLORS as _COLORS
from .series_plots import SERIES_WIDTH_PX, Mark, Panels, series_figure, series_pages

__all__ = ["SERIES_WIDTH_PX", "compare_trials", "create_interactive_matplotlib_histogram",
           "plot_distributions", "plot_series", "series_figure", "series_pages", "tensor_values"]


def _figure(rows: int, cols: int, width: float = 4.2, height: float = 2.8) -> tuple[Any, Any, list]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, height * rows), dpi=80)
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, canvas, [ax for row in axes for ax in row]


def _as_trial(trial: Trial | str) -> Trial:
    return trial if isinstance(trial, Trial) else create_trial(trial)


def _resolve(trial: Trial, tensors: str | Sequence[str]) -> list[str]:
    """Tensor names from names or regexes (re.search, as trial.tensor_names); raise if none."""
    names = analysis.match_tensors(trial, tensors)
    if not names:
        wanted = [tensors] if isinstance(tensors, str) else list(tensors)
        raise MltraceValueError(
            f"no tensor of trial {trial.name!r} matches {wanted}; "
            f"it has {trial.tensor_names()[:20]}")
    return names


def tensor_values(trial: Trial | str, tensors: str | Sequence[str],
                  steps: Sequence[int] | None = None, mode: ModeKeys | str = ModeKeys.GLOBAL,
                  max_steps: int | None = 50) -> dict[str, dict[int, np.ndarray]]:
    """``{name: {step: value}}`` from a trial (the notebook's rule output shape).

    Args:
        trial: a Trial or its path.
        tensors: names or regexes.
        steps: steps to read (default: the saved ones, at most ``max_steps`` spread evenly).
        mode: mode of ``steps``.
        max_steps: cap on steps per tensor when ``steps`` is None.
    """
    trial = _as_trial(trial)
    mode = mode_from(mode)
    out: dict[str, dict[int, np.ndarray]] = {}
    for name in _resolve(trial, tensors):
        tensor = trial.tensor(name)
        chosen = list(steps) if steps is not None else analysis.thin(tensor.steps(mode), max_steps)
        values = {}
        for step in chosen:
            try:
                values[step] = np.asarray(tensor.value(step, mode))
            except MltraceError:
                continue
        if values:
            out[name] = values
    if not out:
        raise MltraceValueError(
            f"no saved values of {tensors} in trial {trial.name!r} (only reductions?)")
    return out


def _gif(frames: list[Any], filename: str, duration_ms: int) -> str:
    frames[0].save(filename, save_all=True, append_images=frames[1:], duration=duration_ms, loop=0,
                   optimize=False)
    return filename


def _frame(canvas: Any, draw: bool = True) -> Any:
    from PIL import Image

    if draw:
        canvas.draw()
    width, height = canvas.get_width_height()
    image = Image.frombuffer("RGBA", (width, height), bytes(canvas.buffer_rgba()), "raw", "RGBA", 0,
                             1)
    return image.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=64)


def _animate(panels: Mapping[str, Sequence[tuple[str, Mapping[int, np.ndarray]]]], filename: str,
             bins: int, duration_ms: int, title: str) -> str:
    """One GIF frame per step; one panel per title, one histogram per (label, {step: value}).

    Histograms are computed with numpy on fixed edges per panel; each frame only updates the
    heights of step patches (no re-layout), which keeps a 50-frame GIF to a few seconds.
    """
    steps = sorted({s for series in panels.values() for _, vals in series for s in vals})
    if not steps:
        raise MltraceValueError("nothing to plot: no steps")
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, canvas, axes = _figure(rows, cols)
    counts: dict[tuple[str, int], dict[int, np.ndarray]] = {}
    patches = []
    for ax, (name, series) in zip(axes, panels.items()):
        edges = analysis.common_edges((v for _, vals in series for v in vals.values()), bins)
        top = 1
        for i, (label, vals) in enumerate(series):
            hist = {s: np.histogram(finite_values(v), edges)[0] for s, v in vals.items()}
            counts[(name, i)] = hist
            top = max([top] + [int(h.max(initial=0)) for h in hist.values()])
            patch = ax.stairs(np.zeros(bins), edges, fill=True,
                              alpha=0.55 if len(series) > 1 else 0.9,
                              color=_COLORS[i % len(_COLORS)], label=label or None)
            patches.append(((name, i), patch))
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylim(0, top * 1.05)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        if len(series) > 1:
            ax.legend(fontsize=7, loc="upper right")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    heading = fig.suptitle(f"{title}step {steps[0]}", fontsize=10)
    fig.tight_layout()
    # Blitting: draw axes, ticks and labels once; per frame redraw only the patches and title.
    for _, patch in patches:
        patch.set_animated(True)
    heading.set_animated(True)
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    frames = []
    zeros = np.zeros(bins)
    for step in steps:
        canvas.restore_region(background)
        for key, patch in patches:
            patch.set_data(values=counts[key].get(step, zeros))
            fig.draw_artist(patch)
        heading.set_text(f"{title}step {step}")
        fig.draw_artist(heading)
        frames.append(_frame(canvas, draw=False))
    return _gif(frames, filename, duration_ms)


def create_interactive_matplotlib_histogram(tensors: Mapping[str, Mapping[int, Any]],
                                            filename: str = "histogram.gif", bins: int = 50,
                                            duration_ms: int = 400) -> str:
    """The tensor-analysis notebook's helper: an animated GIF of each tensor's histogram, one frame per step.

    Args:
        tensors: ``{tensor name: {step: value}}``.
        filename: the GIF to write.
        bins: histogram bins (fixed edges per tensor over all steps).
        duration_ms: time per frame.

    Returns:
        ``filename``.
    """
    panels = {name: [("", {int(s): np.asarray(v) for s, v in vals.items()})]
              for name, vals in tensors.items()}
    return _animate(panels, filename, bins, duration_ms, "")


def plot_distributions(trial: Trial | str, tensors: str | Sequence[str],
                       filename: str = "distributions.gif", steps: Sequence[int] | None = None,
                       mode: ModeKeys | str = ModeKeys.GLOBAL,
                       bins: int = 50, max_steps: int | None = 50, duration_ms: int = 400) -> str:
    """Animated GIF of how tensors' value distributions move over the steps of a trial.

    Args:
        trial: a Trial or its path.
        tensors: names or regexes (e.g. ``".*gradient"``).
        filename: the GIF to write.
        steps, mode, max_steps: which steps (default: saved ones, at most ``max_steps``).
        bins, duration_ms: histogram bins, time per frame.

    Returns:
        ``filename``.
    """
    values = tensor_values(trial, tensors, steps, mode, max_steps)
    return create_interactive_matplotlib_histogram(values, filename, bins, duration_ms)


def compare_trials(trial_a: Trial | str, trial_b: Trial | str, tensors: str | Sequence[str],
                   filename: str = "comparison.png", labels: Sequence[str] | None = None,
                   steps: Sequence[int] | None = None, mode: ModeKeys | str = ModeKeys.GLOBAL,
                   bins: int = 50, max_steps: int | None = 50, duration_ms: int = 400) -> str:
    """Two trials side by side, tensor by tensor (the tensor-analysis notebook's good vs bad initialisation).

    A ``.gif`` filename gives the notebook's animation (both trials' histograms overlaid, one
    frame per step). Any other gives a PNG with, per tensor, the two distributions at the last
    step both saved, and the mean and standard deviation of each over steps.

    Args:
        trial_a, trial_b: Trials or paths.
        tensors: names or regexes, resolved in ``trial_a``.
        filename: ``.png`` (or other matplotlib format) or ``.gif``.
        labels: the two legend labels (default: the trial names).

    Returns:
        ``filename``.
    """
    a, b = _as_trial(trial_a), _as_trial(trial_b)
    labels = tuple(labels) if labels else (a.name, b.name)
    if len(labels) != 2:
        raise MltraceValueError(f"labels={labels!r}: give two labels, one per trial")
    names = _resolve(a, tensors)
    values_a = tensor_values(a, names, steps, mode, max_steps)
    in_b = [n for n in names if b.has_tensor(n)] or names
    values_b = tensor_values(b, in_b, steps, mode, max_steps)
    common = [n for n in names if n in values_a and n in values_b]
    if not common:
        raise MltraceValueError(f"the trials share no saved tensor among {names}")
    pairs = {n: [(labels[0], values_a[n]), (labels[1], values_b[n])] for n in common}
    if filename.lower().endswith(".gif"):
        return _animate(pairs, filename, bins, duration_ms, f"{labels[0]} vs {labels[1]}: ")
    fig, canvas, axes = _figure(len(common), 2, width=4.8)
    for row, (name, pair) in enumerate(pairs.items()):
        _draw_pair(axes[2 * row], axes[2 * row + 1], name, pair, bins)
    fig.tight_layout()
    fig.savefig(filename)
    return filename


def _finite_mean_std(value: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of the finite values (NaN, NaN when there is none)."""
    finite = finite_values(value)
    return (float(np.mean(finite)), float(np.std(finite))) if finite.size else (np.nan, np.nan)


def _draw_pair(hist_ax: Any, stat_ax: Any, name: str,
               pair: Sequence[tuple[str, Mapping[int, np.ndarray]]], bins: int) -> None:
    """One tensor of two trials: both distributions at the last step both saved (left), and each
    one's mean ± std over steps (right)."""
    shared = sorted(set(pair[0][1]) & set(pair[1][1]))
    edges = analysis.common_edges([v for _, vals in pair for v in vals.values()], bins)
    for color, (label, vals) in zip(_COLORS, pair):
        last = shared[-1] if shared else max(vals)
        hist_ax.hist(finite_values(vals[last]), bins=edges, alpha=0.55, color=color,
                     label=f"{label} (step {last})")
        xs = sorted(vals)
        means, stds = zip(*(_finite_mean_std(vals[s]) for s in xs))
        stat_ax.plot(xs, means, color=color, label=f"{label} mean")
        stat_ax.fill_between(xs, np.subtract(means, stds), np.add(means, stds), color=color,
                             alpha=0.2)
    hist_ax.set_title(f"{name}: distribution", fontsize=9)
    stat_ax.set_title(f"{name}: mean ± std over steps", fontsize=9)
    stat_ax.set_xlabel("step", fontsize=8)
    for ax in (hist_ax, stat_ax):
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)


def plot_series(panels: Panels, filename: str,
                markers: Mapping[str, Mapping[str, int]] | None = None, title: str = "",
                mark: Mark | None = None) -> str:
    """Line plots, one panel per title with one line per label (``{label: (steps, values)}``);
    ``markers`` (``{label: {text: step}}``) draws dotted vertical lines, e.g. where a rule fired.
    Every panel in one file; ``mltrace_mlflow.compare`` writes pages instead
    (:func:`~mltrace_mlflow.series_plots.series_pages`). See
    :func:`~mltrace_mlflow.series_plots.series_figure` for the layout.

    Returns:
        ``filename``.
    """
    fig = series_figure(panels, markers, title, mark)
    fig.savefig(filename)
    return filename
