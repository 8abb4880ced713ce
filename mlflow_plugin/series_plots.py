"""Line plots of statistics over steps, one panel per tensor and statistic, one line per run: the
figures of ``mltrace compare`` (compare.py), in pages of at most PANELS_PER_PAGE panels.

Layout: 1600 px wide (at 100 dpi), two panels per row, each row 4.2 inches high, one legend for
every panel below them. The geometry is fixed in inches rather than left to matplotlib's
constrained layout: the panels are all alike, and constrained layout measured every tick label
of every panel twice (half the drawing time; a 101-panel figure took 27 s and was 21,538 px
tall). The margins leave room for tick labels of up to about nine characters, which the
default formatters never exceed (they switch to an offset or to powers of ten first).

Y axes are logarithmic where a panel's values span two decades or more, symmetric-log where they
include zeros or negatives (so that 1e-9 and 0 stay apart). Rule findings are dotted vertical
lines in the run's colour; a :class:`Mark` (where two runs part ways) is a dashed black line on
every panel, its panel's title in red.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mltrace.exceptions import MltraceValueError

#: ``{panel title: {line label: (steps, values)}}``
Panels = Mapping[str, Mapping[str, tuple[Sequence[int], Sequence[float]]]]

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")
#: Width of a series figure in pixels (at 100 dpi): readable on a screen and in MLflow's viewer.
SERIES_WIDTH_PX = 1600
#: Panels per page: six rows of two, a 1600 x ~2,700 px image.
PANELS_PER_PAGE = 12
MARK_COLOR = "#c00000"
#: The gid of a Mark's lines (tests and tools find them by it).
MARK_GID = "mltrace-mark"

_DPI = 100
_ROW_IN = 4.2  # a row: the axes and, below and above them, tick labels, x label and title
_AXES_IN = 3.15
_LEFT_IN, _RIGHT_IN, _GAP_IN = 1.05, 0.35, 1.3  # the gap holds the right panel's y labels
_LEGEND_ROW_IN = 0.28
_XLABEL_IN, _YLABEL_IN = 0.3, 0.78  # axis labels' distance from the axes (past the tick labels)


@dataclass(frozen=True)
class Mark:
    """A step marked on every panel: a dashed black line, ``text`` in the legend; the panel
    titled ``panel`` (if any) gets a red title starting with ``prefix``."""

    step: int
    text: str
    panel: str | None = None
    prefix: str = "► "


def series_figure(panels: Panels, markers: Mapping[str, Mapping[str, int]] | None = None,
                  title: str = "", mark: Mark | None = None) -> Any:
    """The matplotlib Figure of one page of panels (see the module docstring).

    Args:
        panels: ``{title: {label: (steps, values)}}``, drawn in their order.
        markers: ``{label: {text: step}}``: dotted vertical lines, e.g. where a rule fired.
        title: the figure's title.
        mark: a step to mark on every panel (where two runs part ways).

    Raises:
        MltraceValueError: no panel.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not panels:
        raise MltraceValueError("nothing to plot")
    cols = min(2, len(panels))
    rows = math.ceil(len(panels) / cols)
    labels = sorted({label for lines in panels.values() for label in lines})
    legend_rows = math.ceil((len(labels) + (1 if mark else 0)
                             + sum(len(m) for m in (markers or {}).values())) / 2)
    fig = Figure(figsize=(SERIES_WIDTH_PX / _DPI, _height(rows, legend_rows, title)), dpi=_DPI)
    FigureCanvasAgg(fig)
    axes = _grid(fig, rows, cols, legend_rows, title)
    color = {label: COLORS[i % len(COLORS)] for i, label in enumerate(labels)}
    handles: dict[str, Any] = {}
    for ax, (name, lines) in zip(axes, panels.items()):
        _draw_panel(ax, name, lines, color, markers or {}, handles, 90 if cols == 1 else 70,
                    ax.get_position().width * fig.get_figwidth())
        if mark is not None:
            _draw_mark(ax, name, mark, handles)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.legend(list(handles.values()), [shorten_middle(t, 80) for t in handles],
               loc="lower center", bbox_to_anchor=(0.5, 0.1 / fig.get_figheight()), ncols=2,
               fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=12, y=1 - 0.12 / fig.get_figheight(), va="top")
    return fig


def series_pages(panels: Panels, path: str, markers: Mapping[str, Mapping[str, int]] | None = None,
                 title: str = "", mark: Mark | None = None,
                 per_page: int = PANELS_PER_PAGE) -> list[str]:
    """Write ``panels`` as PNG pages of at most ``per_page`` panels each: ``path`` itself when
    one page holds them all, else ``<stem>-1.png``, ``<stem>-2.png``, ... Each page's title says
    which panels it holds.

    Returns:
        the paths written, in order.
    """
    names = list(panels)
    pages = [names[i:i + per_page] for i in range(0, len(names), max(1, per_page))]
    stem, ext = os.path.splitext(path)
    written = []
    for number, page in enumerate(pages, 1):
        heading = title
        target = path
        if len(pages) > 1:
            span = f"panels {(number - 1) * per_page + 1}–{(number - 1) * per_page + len(page)}"
            heading = f"{title} · page {number} of {len(pages)} ({span} of {len(names)})"
            target = f"{stem}-{number}{ext or '.png'}"
        fig = series_figure({n: panels[n] for n in page}, markers, heading, mark)
        fig.savefig(target)
        written.append(target)
    return written


def _height(rows: int, legend_rows: int, title: str) -> float:
    return _ROW_IN * rows + (0.35 if title else 0.1) + 0.45 + _LEGEND_ROW_IN * legend_rows


def _grid(fig: Any, rows: int, cols: int, legend_rows: int, title: str) -> list[Any]:
    """The panels' axes, placed in inches: margins, a gap between the columns for the right
    panels' y labels, the room below each row for its x labels and the next row's title."""
    width, height = fig.get_figwidth(), fig.get_figheight()
    top = (0.35 if title else 0.1) + (_ROW_IN - _AXES_IN) * 0.35
    bottom = 0.45 + _LEGEND_ROW_IN * legend_rows + (_ROW_IN - _AXES_IN) * 0.65
    axes_w = (width - _LEFT_IN - _RIGHT_IN - (cols - 1) * _GAP_IN) / cols
    grid = fig.add_gridspec(rows, cols, left=_LEFT_IN / width, right=1 - _RIGHT_IN / width,
                            top=1 - top / height, bottom=bottom / height,
                            wspace=_GAP_IN / axes_w, hspace=(_ROW_IN - _AXES_IN) / _AXES_IN)
    return [fig.add_subplot(grid[r, c]) for r in range(rows) for c in range(cols)]


def _draw_panel(ax: Any, name: str, lines: Mapping[str, tuple[Sequence[int], Sequence[float]]],
                color: Mapping[str, str], markers: Mapping[str, Mapping[str, int]],
                handles: dict[str, Any], title_chars: int, axes_width: float) -> None:
    """One panel: a line per run, the rule markers of its runs, its scale, title and labels."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    values = []
    for label, (xs, ys) in lines.items():
        ax.plot(list(xs), list(ys), color=color[label], linewidth=1.6,
                marker="." if len(xs) < 30 else None)
        handles.setdefault(label, Line2D([], [], color=color[label], linewidth=2))
        values += [float(v) for v in ys if v is not None and math.isfinite(float(v))]
        for text, step in (markers.get(label) or {}).items():
            ax.axvline(step, color=color[label], linestyle=":", linewidth=1.4)
            handles.setdefault(f"{label}: {text} fired at step {step}",
                               Line2D([], [], color=color[label], linestyle=":"))
    scale = y_scale(values)
    if scale == "log":
        ax.set_yscale("log")
    elif scale == "symlog":
        ax.set_yscale("symlog", linthresh=min(abs(v) for v in values if v != 0))
    # Title and axis labels at fixed places: matplotlib would otherwise measure every tick label
    # to place them (a third of the drawing time); the margins leave room for the tick labels.
    ax.set_title(shorten_middle(name, title_chars), fontsize=11, y=1.0, pad=6)
    ax.set_xlabel("global step", fontsize=10)
    ax.set_ylabel(name.rsplit(" · ", 1)[-1] + (" (log scale)" if scale else ""), fontsize=10)
    ax.xaxis.set_label_coords(0.5, -_XLABEL_IN / _AXES_IN)
    ax.yaxis.set_label_coords(-_YLABEL_IN / axes_width, 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    ax.tick_params(labelsize=9)
    ax.grid(True, alpha=0.3)


def _draw_mark(ax: Any, name: str, mark: Mark, handles: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D

    ax.axvline(mark.step, color="black", linestyle="--", linewidth=1.2, gid=MARK_GID)
    handles.setdefault(mark.text, Line2D([], [], color="black", linestyle="--"))
    if name == mark.panel:
        ax.set_title(shorten_middle(mark.prefix + name, 70), fontsize=11, color=MARK_COLOR,
                     fontweight="bold", y=1.0, pad=6)
        for spine in ax.spines.values():
            spine.set_edgecolor(MARK_COLOR)
            spine.set_linewidth(1.6)


def y_scale(values: Sequence[float]) -> str | None:
    """"log" when positive values span at least two decades, "symlog" when values that span two
    decades include zeros or negatives, else None (linear)."""
    nonzero = [abs(v) for v in values if v != 0]
    if not nonzero or max(nonzero) / min(nonzero) < 100:
        return None
    return "log" if all(v > 0 for v in values) else "symlog"


def shorten_middle(text: str, width: int) -> str:
    """``text`` cut in the middle to at most ``width`` characters."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[-(width - 1 - head):]
