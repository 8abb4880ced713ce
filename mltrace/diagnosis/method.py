"""How a diagnosis decides: its thresholds, in one place, and the trailing-window statistics
every tensor is judged by.

Every value is judged against its own tensor's trailing window (the ``window`` steps before it):
its robust z-score is (value - median) / (1.4826 x MAD), the median absolute deviation scaled
to a standard deviation, so that a few spikes inside the window do not hide the next one (a
mean and a standard deviation would). The scale has a floor (``min_scale`` of the median's
magnitude), so that a tensor that hardly moves (a layer norm's weight under a small learning
rate) is not said to jump on a change of a thousandth. Every decision is deterministic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mltrace.stability.windows import MAD_TO_STD, window_mad, window_median


@dataclass(frozen=True)
class Method:
    """The thresholds of a diagnosis (documented in docs/guide/diagnose.md).

    Attributes:
        window: steps before a value that it is judged against.
        min_history: finite values a window needs before its tensor can be judged.
        lookback: steps before the anomaly searched for where the trouble began (the onset).
        z_anomaly: robust z above which the loss or the global gradient norm is an anomaly...
        spike_ratio: ...when the loss is also this many times its window's median...
        grad_spike_ratio: ...or the gradient norm this many times its median (gradient norms
            are heavy-tailed: the GradNormSpike rule's ratio).
        z_deviation: robust z from which a tensor counts as having left its window...
        min_relative: ...when it also moved by this share of its window's median.
        sustain: a signal that stays out of its window this many steps in a row (by
            ``z_anomaly`` and ``sustain_relative`` of its median) is an anomaly too (slow faults:
            a growing attention logit, an optimizer setting gone wrong).
        sustain_relative: see ``sustain``.
        min_scale: the floor of a window's scale, as a share of its median's magnitude.
        jump_ratio: a tensor that is this many times its window's median at the onset, from a
            normal value the step before, jumped (a sudden change) rather than grew.
        sample_ratio: a sample whose loss is this many times the batch's median loss stands out.
        fall_ratio: when most parameters' Adam ratio of the squared gradient to its second
            moment falls to this fraction of its window's median or less, ``sustain`` steps in a
            row, it is an anomaly (a stale second moment; judged by the factor alone).
    """

    window: int = 50
    min_history: int = 50
    lookback: int = 2
    z_anomaly: float = 8.0
    spike_ratio: float = 1.5
    grad_spike_ratio: float = 4.0
    z_deviation: float = 8.0
    min_relative: float = 0.3
    sustain: int = 5
    sustain_relative: float = 0.5
    min_scale: float = 0.01
    jump_ratio: float = 5.0
    sample_ratio: float = 3.0
    fall_ratio: float = 20.0

    def to_dict(self) -> dict[str, float]:
        """The thresholds as JSON (every report carries the ones it used)."""
        return asdict(self)


def trailing(values: np.ndarray, method: Method) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the median and the scale (1.4826 x MAD, floored) of the finite values of the
    ``window`` steps before it; NaN where fewer than ``min_history`` are finite."""
    n, w = len(values), method.window
    padded = np.concatenate([np.full(w, np.nan), values])
    windows = sliding_window_view(padded, w)[:n].T  # column i: the window before step i
    count = np.sum(np.isfinite(windows), axis=0)
    median, mad = window_median(windows), window_mad(windows)
    scale = np.maximum(MAD_TO_STD * mad, method.min_scale * np.abs(median))
    scale = np.maximum(scale, 1e-12)
    median[count < method.min_history] = np.nan
    scale[count < method.min_history] = np.nan
    return median, scale


def robust_z(values: np.ndarray, method: Method) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the robust z-score of each value against its trailing window (NaN where it
    cannot be judged), and that window's median."""
    median, scale = trailing(values, method)
    with np.errstate(invalid="ignore"):
        return (values - median) / scale, median


def deviates(values: np.ndarray, z: np.ndarray, median: np.ndarray, method: Method) -> np.ndarray:
    """Per step, True where a value left its window: |z| >= z_deviation and it moved by at least
    ``min_relative`` of the window's median."""
    with np.errstate(invalid="ignore"):
        moved = np.abs(values - median) >= method.min_relative * np.abs(median)
        return (np.abs(z) >= method.z_deviation) & moved
