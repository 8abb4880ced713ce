"""Where a run broke: the anomaly (the step to explain), the onset (the first step where
something left its window, which may come before the loss moved) and the origin (the tensors
that left first, in the step's execution order).

The anomaly is the earliest of: a non-finite value in any tensor; the loss, or the model's
global gradient norm, spiking above its window (robust z >= ``z_anomaly`` and ``spike_ratio``
times its median; a gradient spike only where it reached the updates or the loss, see
``_reached_training``); a stability signal or the loss out of its window ``sustain`` steps in a row;
a flight-recorder dump; or the step the user asked about. The onset is searched in the
``lookback`` steps before it: each tensor's first step out of its window (or not finite); the
origin is every such tensor ranked by that step, then by its place in the step's execution order
(mltrace.diagnosis.table), then by how far it left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mltrace.diagnosis.method import Method, deviates, robust_z
from mltrace.diagnosis.table import PHASES, SignalTable, Track
from mltrace.stability.signals import parse_signal


@dataclass(frozen=True)
class Anomaly:
    """A step to explain and why it was picked."""

    step: int
    kind: str  # nonfinite, loss_spike, grad_norm_spike, update_spike, jump, sustained, flight_recorder, asked
    tensor: str | None
    detail: str


@dataclass(frozen=True)
class Departure:
    """A tensor that left its window: the first step it did in the searched range, its robust z
    there (inf for a non-finite value), its value and its window's median then."""

    tensor: str
    step: int
    z: float
    value: float
    median: float
    phase: str
    position: int


@dataclass
class Scores:
    """Every track's robust z, window median and departures, computed once per diagnosis."""

    z: dict[str, np.ndarray]
    median: dict[str, np.ndarray]
    out: dict[str, np.ndarray]


def score(table: SignalTable, method: Method) -> Scores:
    """The robust z of every value of every track against its trailing window."""
    z, median, out = {}, {}, {}
    for name, track in table.tracks.items():
        z[name], median[name] = robust_z(track.values, method)
        out[name] = deviates(track.values, z[name], median[name], method) | track.nonfinite
    return Scores(z, median, out)


def global_grad_norms(table: SignalTable) -> list[str]:
    """The tracks of a model's gradient norm over all its parameters (``grad_norm/<model>``)."""
    names = []
    for name in table.tracks:
        signal = parse_signal(name)
        if signal is not None and signal.collection == "grad_norms" and "." not in signal.subject:
            names.append(name)
    return names


#: The signals whose staying out of their windows is an anomaly by itself: the way that matters
#: (+1 up, -1 down, 0 either) and the magnitude below which it does not (an attention logit
#: under 10 is no threat to the softmax, whatever its growth: the AttentionLogitGrowth rule's
#: floor). A slow fault shows in them before the loss moves.
SUSTAINED: dict[tuple[str, str], tuple[int, float]] = {
    ("attention", "max_logit"): (1, 10.0), ("optimizer_state", "eps_fraction"): (1, 0.0),
    ("optimizer_state", "grad_sq_ratio"): (-1, 0.0), ("updates", "ratio"): (0, 0.0)}
#: Adam's squared gradient over its second moment (one per parameter; see _stale_moments).
GRAD_SQ_RATIO = ("optimizer_state", "grad_sq_ratio")


def sustained_direction(name: str, losses: list[str]) -> tuple[int, float] | None:
    """The way ``name`` may stay out of its window to be an anomaly and its floor (see
    SUSTAINED; a loss: up, no floor), or None for a tensor that is not judged so."""
    if name in losses:
        return 1, 0.0
    signal = parse_signal(name)
    if signal is None:
        return None
    return SUSTAINED.get((signal.collection, signal.quantity or ""))


def find_anomalies(table: SignalTable, scores: Scores, method: Method,
                   dumps: list[tuple[int, str]]) -> list[Anomaly]:
    """Every kind of anomaly at the first step it shows, earliest first (see module docstring).
    ``dumps`` are the flight recorder's (step, reason)."""
    found: list[Anomaly] = []
    steps = table.steps
    first_bad = _first_nonfinite(table)
    if first_bad is not None:
        row, name = first_bad
        found.append(Anomaly(int(steps[row]), "nonfinite", name, f"{name} held a NaN or an infinity"))
    for kind, names, ratio in (("loss_spike", table.losses, method.spike_ratio),
                               ("grad_norm_spike", global_grad_norms(table), method.grad_spike_ratio)):
        for name in names:
            track, z, median = table.tracks[name], scores.z[name], scores.median[name]
            with np.errstate(invalid="ignore"):
                spikes = (z >= method.z_anomaly) & (track.values >= ratio * median)
            rows = np.flatnonzero(spikes)
            if kind == "grad_norm_spike":
                rows = rows[[_reached_training(table, scores, method, int(r)) for r in rows]]
            if rows.size:
                r = int(rows[0])
                found.append(Anomaly(int(steps[r]), kind, name,
                                     f"{name} = {track.values[r]:.4g}, {track.values[r] / median[r]:.3g} times "
                                     f"the median of the {method.window} steps before (robust z {z[r]:.1f})"))
    sustained = _first_sustained(table, scores, method)
    if sustained is not None:
        row, name = sustained
        found.append(Anomaly(int(steps[row]), "sustained", name,
                             f"{name} stayed out of its window for {method.sustain} steps from step "
                             f"{int(steps[row])} ({table.tracks[name].values[row] / scores.median[name][row]:.3g} "
                             f"times its median, robust z {scores.z[name][row]:.1f})"))
    found += _jumps(table, scores, method) + _update_spikes(table, scores, method)
    found += _stale_moments(table, scores, method)
    for step, reason in dumps:
        found.append(Anomaly(step, "flight_recorder", None, f"the flight recorder dumped: {reason}"))
    return sorted(found, key=lambda a: a.step)


def _reached_training(table: SignalTable, scores: Scores, method: Method, row: int) -> bool:
    """Whether a gradient-norm spike at ``row`` reached training: an update-to-weight ratio or
    the loss left its window at that step or in the ``lookback`` steps after it. A spike that
    clipping absorbed moves neither and is a healthy run's (heavy-tailed gradients); a trial that
    records no update ratios cannot tell, so every spike counts there."""
    ratios = table.update_ratios
    if not ratios:
        return True
    span = slice(row, row + method.lookback + 1)
    return any(bool(scores.out[name][span].any()) for name in (*ratios, *table.losses))


def _jumps(table: SignalTable, scores: Scores, method: Method) -> list[Anomaly]:
    """The first step where a module output's largest or L2 magnitude jumped ``jump_ratio``
    times its window's median (robust z >= z_anomaly) from a normal value the step before."""

    def first_jump(name: str, track: Track) -> int | None:
        if not (name.startswith("activations/") and name.endswith(("/abs_max", "/l2"))):
            return None
        z, median, out = scores.z[name], scores.median[name], scores.out[name]
        with np.errstate(invalid="ignore"):
            jumped = (z >= method.z_anomaly) & (track.values >= method.jump_ratio * median)
        jumped[1:] &= ~out[:-1]
        return _first(jumped)

    found = _earliest(table, first_jump)
    if found is None:
        return []
    row, name = found
    ratio = table.tracks[name].values[row] / scores.median[name][row]
    return [Anomaly(int(table.steps[row]), "jump", name,
                    f"{name} jumped to {ratio:.3g} times the median of the {method.window} steps before")]


def _update_spikes(table: SignalTable, scores: Scores, method: Method) -> list[Anomaly]:
    """The first step where most update-to-weight ratios were ``grad_spike_ratio`` times their
    window's medians or more at once (a learning-rate jump moves every parameter)."""
    names = table.update_ratios
    if not names:
        return []
    with np.errstate(invalid="ignore"):
        high = np.stack([(scores.z[n] >= method.z_anomaly)
                         & (table.tracks[n].values >= method.grad_spike_ratio * scores.median[n]) for n in names])
    rows = np.flatnonzero(high.mean(axis=0) > 0.5)
    if not rows.size:
        return []
    r = int(rows[0])
    return [Anomaly(int(table.steps[r]), "update_spike", None,
                    f"{int(high[:, r].sum())} of {len(names)} update-to-weight ratios were "
                    f"{method.grad_spike_ratio:g} times their medians or more at once")]


def _stale_moments(table: SignalTable, scores: Scores, method: Method) -> list[Anomaly]:
    """The first step from which most parameters' Adam ``grad_sq_ratio`` stayed at a
    ``fall_ratio``-th of its window's median or less ``sustain`` steps in a row, while its
    gradient norm stayed above half its median: a second moment gone stale (beta2 close to 1) is
    an optimizer setting, and moves every parameter. Judged by
    that factor, not by z: the ratio's window is wide (one parameter's can swing from 0.001 to 1
    in a healthy run), so a thousandfold fall may still score a robust z of -2."""
    pairs = [(n, f"grad_norm/{signal.subject}") for n in table.tracks
             if (signal := parse_signal(n)) is not None and (signal.collection, signal.quantity) == GRAD_SQ_RATIO]
    pairs = [(n, g) for n, g in pairs if g in table.tracks]
    if not pairs:
        return []
    names = [n for n, _ in pairs]
    with np.errstate(invalid="ignore"):
        # ...while the gradient itself kept its size: a gradient that shrinks (a loss that
        # converges) makes the ratio fall too, with the second moment doing its job
        fell = np.stack([(table.tracks[n].values * method.fall_ratio <= scores.median[n])
                         & (table.tracks[g].values >= 0.5 * scores.median[g]) for n, g in pairs])
    most = (fell.mean(axis=0) > 0.5).astype(np.int32)
    k = method.sustain
    if most.sum() < k:
        return []
    rows = np.flatnonzero(np.convolve(most, np.ones(k, dtype=np.int32), mode="valid") == k)
    if not rows.size:
        return []
    r = int(rows[0])
    first = min((table.tracks[n].order, n) for i, n in enumerate(names) if fell[i, r])[1]
    return [Anomaly(int(table.steps[r]), "sustained", first,
                    f"{int(fell[:, r].sum())} of {len(names)} parameters' grad_sq_ratio (Adam's squared "
                    f"gradient over its second moment) fell to a {method.fall_ratio:g}th of their medians "
                    f"or less for {k} steps from step {int(table.steps[r])}")]


def _first_nonfinite(table: SignalTable) -> tuple[int, str] | None:
    """The row and track of the first non-finite value, in execution order within the row."""
    return _earliest(table, lambda name, track: _first(track.nonfinite))


def _first(mask: np.ndarray) -> int | None:
    """The first row where ``mask`` holds, or None."""
    rows = np.flatnonzero(mask)
    return int(rows[0]) if rows.size else None


def _earliest(table: SignalTable, first_row: Callable[[str, Track], int | None]) -> tuple[int, str] | None:
    """The (row, track) where ``first_row(name, track)`` is earliest over every track, ties
    going to the track first in the step's execution order (then by name); None if no track has
    one."""
    best: tuple[int, tuple[int, int], str] | None = None
    for name, track in table.tracks.items():
        row = first_row(name, track)
        if row is not None and (best is None or (row, track.order, name) < best):
            best = (row, track.order, name)
    return None if best is None else (best[0], best[2])


def _first_sustained(table: SignalTable, scores: Scores, method: Method) -> tuple[int, str] | None:
    """The earliest row from which a signal of SUSTAINED (or the loss) stays out of its window
    ``sustain`` steps in a row, the way that matters, by ``z_anomaly`` and ``sustain_relative``
    of its median; and its track."""
    k = method.sustain

    def first_run(name: str, track: Track) -> int | None:
        judged = sustained_direction(name, table.losses)
        if judged is None:
            return None
        direction, floor = judged
        z, median = scores.z[name], scores.median[name]
        with np.errstate(invalid="ignore"):
            moved = np.abs(track.values - median) >= method.sustain_relative * np.abs(median)
            # a growth out of a floor is judged by how far it moved alone: a window that grows
            # with it has a wide spread, and a small z (an attention logit x1.03 a step)
            far = (moved if floor else moved & (np.abs(z) >= method.z_anomaly)) & ~track.nonfinite
            far &= np.abs(track.values) >= floor
        rows = []
        for sign in ((1, -1) if direction == 0 else (direction,)):
            same = far & (np.sign(z) == sign)
            if same.sum() >= k:
                row = _first(np.convolve(same.astype(np.int32), np.ones(k, dtype=np.int32), mode="valid") == k)
                rows += [row] if row is not None else []
        return min(rows) if rows else None

    return _earliest(table, first_run)


def departures(table: SignalTable, scores: Scores, method: Method, anomaly_step: int,
               anomaly_tensor: str | None = None) -> list[Departure]:
    """Every tensor that left its window in the ``lookback`` steps up to the anomaly, from a step
    where it was within it (a tensor already out before the range left earlier, for reasons of
    its own: a trend), and the anomaly's own tensor at its step (it left by the anomaly's
    measure), ranked: earliest step first, then execution order within the step, then the
    largest |z|."""
    end = table.index_of(anomaly_step)
    if end is None:
        end = int(np.searchsorted(table.steps, anomaly_step, side="right")) - 1
    if end < 0:
        return []
    start = max(1, end - method.lookback)
    found = []
    for name, track in table.tracks.items():
        out = scores.out[name]
        fresh = out[start:end + 1] & ~out[start - 1:end]
        with np.errstate(invalid="ignore"):  # before the anomaly's step: only a tensor that left by far
            far = (np.abs(scores.z[name]) >= 2 * method.z_deviation) & (
                np.abs(track.values - scores.median[name]) >= np.abs(scores.median[name])) | track.nonfinite
        fresh[:-1] &= far[start:end]
        rows = np.flatnonzero(fresh)
        if rows.size:
            r = start + int(rows[0])
            found.append(_departure(track, scores, r, int(table.steps[r])))
    if anomaly_tensor in table.tracks and not any(d.tensor == anomaly_tensor for d in found):
        found.append(_departure(table.tracks[anomaly_tensor], scores, end, int(table.steps[end])))
    found.sort(key=lambda d: (d.step, PHASES.index(d.phase), d.position, -abs(d.z)))
    return found


def _departure(track: Track, scores: Scores, row: int, step: int) -> Departure:
    bad = bool(track.nonfinite[row])
    return Departure(track.name, step, float("inf") if bad else float(scores.z[track.name][row]),
                     float("nan") if bad else float(track.values[row]),
                     float(scores.median[track.name][row]), track.phase, track.position)
