"""A trial read for a diagnosis: one number per tensor and step, each tensor's place in the
step's execution order, and which values were not finite.

A diagnosis compares every recorded tensor with its own past, so it reads each tensor once, as
one value per step: a scalar as it is; a vector of signals (one value per attention head, one
loss per sample) as its largest element (its smallest for an entropy, which collapses); a raw
weight, gradient or activation as its L2 norm, or its stored ``l2`` (else ``abs_max``, ``max``)
reduction where only reductions were saved. Per-sample losses and batch fingerprints
(``samples/...``) are also kept whole, for the report's evidence.

Execution order: a step's records are written in the order the hook saw them within each kind
(module outputs in call order, gradients as autograd produced them, the stability signals in the
order their callbacks ran), so a tensor's place is its phase (weights before the forward pass,
the forward pass, the backward pass, the optimizer's step) and then its record's offset in the
step's events file. A damaged record or events file is left out with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.stability.signals import layer_of, parse_signal

if TYPE_CHECKING:
    from mltrace.trials import Trial
    from mltrace.trials.index import Location

logger = logging.getLogger(__name__)

#: Phases of a training step, in order (a tensor's first sort key within a step): the weights
#: as the step begins, module outputs, the model's output (logits), the loss, gradients, the
#: optimizer's update and state.
PHASES = ("weights", "forward", "output", "loss", "backward", "optimizer", "other")
#: The tensor-name prefix of per-sample losses and batch fingerprints.
SAMPLES_PREFIX = "samples/"
#: Records read per batch (local files are read in one pass per batch; S3 in parallel).
READ_BATCH = 4096
#: Raw records above this many bytes are not read when the tensor has no reduction stored: a
#: diagnosis of a trial of raw multi-megabyte tensors would otherwise read all of them.
MAX_RAW_BYTES = 4 << 20


@dataclass
class Track:
    """One tensor over the trial's steps.

    Attributes:
        name: the tensor's name.
        phase: its phase (one of PHASES).
        position: its record's offset within the step (order within the phase).
        values: one number per step of the table (NaN where it was not recorded or not finite).
        nonfinite: per step, True where a recorded value held a NaN or an infinity.
    """

    name: str
    phase: str
    position: int
    values: np.ndarray
    nonfinite: np.ndarray

    @property
    def order(self) -> tuple[int, int]:
        """(phase index, position): a step's execution order."""
        return PHASES.index(self.phase), self.position


@dataclass
class SignalTable:
    """The tracks of a trial's tensors over its steps (global steps of one worker)."""

    steps: np.ndarray
    tracks: dict[str, Track]
    losses: list[str]
    #: per-sample vectors (``samples/...``) by tensor name and step
    vectors: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    worker: str | None = None
    damaged: list[str] = field(default_factory=list)

    @property
    def update_ratios(self) -> list[str]:
        """The update-to-weight ratio tracks (``updates/<param>/ratio``)."""
        return [n for n in self.tracks if is_update_ratio(n)]

    def index_of(self, step: int) -> int | None:
        """The row of global step ``step`` (None if the table has no such step)."""
        i = int(np.searchsorted(self.steps, step))
        return i if i < len(self.steps) and self.steps[i] == step else None


def is_update_ratio(name: str) -> bool:
    """True for an update-to-weight ratio (``updates/<param>/ratio``)."""
    return name.startswith("updates/") and name.endswith("/ratio")


def layer_name(tensor: str) -> str | None:
    """The layer a tensor belongs to (``h.2`` of ``activations/h.2.mlp.c_fc/abs_max``), or None."""
    signal = parse_signal(tensor)
    return layer_of(signal.subject if signal is not None else tensor)


def phase_of(name: str, losses: Iterable[str], gradients: Iterable[str], weights: Iterable[str]) -> str:
    """The phase of tensor ``name`` (see PHASES)."""
    if name in losses or (name.startswith(SAMPLES_PREFIX) and name.endswith("/loss")):
        return "loss"
    signal = parse_signal(name)
    if signal is not None:
        if signal.collection in ("grad_norms",):
            return "backward"
        if signal.collection in ("updates", "optimizer_state"):
            return "optimizer"
        if signal.collection == "logits":
            return "output"
        return "forward"
    if name in gradients or name.startswith("gradient/"):
        return "backward"
    if name in weights:
        return "weights"
    if "_output_" in name or "_input_" in name or name.startswith(SAMPLES_PREFIX):
        return "forward"
    return "other"


def read_table(trial: Trial, tensors: Sequence[str] | None = None, worker: str | None = None) -> SignalTable:
    """Read ``tensors`` (default: every tensor of the trial) as a SignalTable over the trial's
    global steps, for ``worker`` (default: its first worker).

    Raises:
        MltraceValueError: the trial has no worker ``worker`` (the message lists its workers).
    """
    trial.maybe_refresh()
    workers = trial.workers()
    if worker is not None and worker not in workers:
        raise MltraceValueError(f"trial {trial.path} has no worker {worker!r}; its workers: "
                                f"{', '.join(workers) or 'none yet'}")
    worker = worker or (workers[0] if workers else None)
    steps = np.asarray(sorted(trial.steps()), dtype=np.int64)
    names = sorted(tensors if tensors is not None else trial.tensor_names())
    losses = _members(trial, "losses")
    gradients = _members(trial, "gradients")
    weights = _members(trial, "weights") | _members(trial, "biases")
    table = SignalTable(steps, {}, sorted(n for n in names if n in losses), worker=worker)
    row = {int(s): i for i, s in enumerate(steps)}
    wanted: list[tuple[str, int, Location]] = []  # (name, row of its step, its record)
    positions: dict[str, int] = {}
    for name in names:
        if worker is None:
            break
        entries = trial.index_entries(name)
        for step, at_worker in entries.values.items():
            loc = at_worker.get(worker)
            if loc is None or step not in row:
                continue
            if loc.length > MAX_RAW_BYTES and entries.reductions.get(step):
                continue
            wanted.append((name, row[step], loc))
            positions.setdefault(name, loc.start)
        for step, reduced in entries.reductions.items():
            if step not in row or (entries.values.get(step) or {}).get(worker) is not None:
                continue
            found = reduced.get(worker) or {}
            loc = next((found[k] for k in (("l2", False), ("max", True), ("max", False)) if k in found), None)
            if loc is not None:
                wanted.append((name, row[step], loc))
                positions.setdefault(name, loc.start)
    n = len(steps)
    for name in names:
        if name in positions:
            table.tracks[name] = Track(name, phase_of(name, losses, gradients, weights), positions[name],
                                       np.full(n, np.nan), np.zeros(n, dtype=bool))
    for start in range(0, len(wanted), READ_BATCH):
        _read_batch(trial, table, wanted[start:start + READ_BATCH])
    _zero_weights(table)
    return table


def _zero_weights(table: SignalTable) -> None:
    """An update-to-weight ratio is infinite where the weight was zero (a bias initialised to
    zero, at the first step): not a non-finite value of training when the update itself was
    finite."""
    for name, track in table.tracks.items():
        if is_update_ratio(name):
            update = table.tracks.get(name[: -len("ratio")] + "l2")
            if update is not None:
                track.nonfinite &= ~np.isfinite(update.values)


def _members(trial: Trial, collection: str) -> set[str]:
    try:
        return set(trial.tensor_names(collection=collection))
    except Exception:  # noqa: BLE001 - a trial without the collection
        return set()


def _read_batch(trial: Trial, table: SignalTable, batch: list[tuple[str, int, Location]]) -> None:
    """Read ``batch`` into ``table``; a batch that fails is read record by record, and the
    records that cannot be read are left out with a warning."""
    arrays: list[np.ndarray | None]
    try:
        arrays = list(trial.read_tensors([loc for _, _, loc in batch]))
    except Exception:  # noqa: BLE001 - find the damaged records one by one
        arrays = []
        for name, row, loc in batch:
            try:
                arrays.extend(trial.read_tensors([loc]))
            except Exception as exc:  # noqa: BLE001 - a damaged record: skipped, said once
                arrays.append(None)
                what = f"{name} at step {int(table.steps[row])}: {exc}"
                if len(table.damaged) < 20:
                    logger.warning("diagnosis: skipping a damaged record (%s)", what)
                table.damaged.append(what)
    for (name, row, _), array in zip(batch, arrays):
        if array is None:
            continue
        track = table.tracks[name]
        value, finite = summarize(name, array)
        track.values[row] = value if finite else np.nan
        track.nonfinite[row] = not finite
        if name.startswith(SAMPLES_PREFIX):
            table.vectors.setdefault(name, {})[int(table.steps[row])] = np.asarray(array).reshape(-1)


def summarize(name: str, array: np.ndarray) -> tuple[float, bool]:
    """One number for a recorded value (see the module docstring) and whether every element of
    it was finite."""
    values = np.asarray(array)
    if values.dtype.kind not in "biuf":
        values = values.astype(np.float64) if values.dtype.kind != "c" else np.abs(values)
    if name.startswith(SAMPLES_PREFIX) and name.endswith("/fingerprint"):  # digests: no statistic
        return float("nan"), True
    flat = values.reshape(-1).astype(np.float64, copy=False)
    if not flat.size:
        return float("nan"), True
    finite = bool(np.isfinite(flat).all())
    if not finite:
        return float("nan"), False
    if flat.size == 1:
        return float(flat[0]), True
    signal = parse_signal(name)
    if signal is not None or name.startswith(SAMPLES_PREFIX):
        return float(flat.min() if signal is not None and signal.quantity == "entropy" else flat.max()), True
    return float(np.sqrt(np.dot(flat, flat))), True


__all__ = ["PHASES", "SAMPLES_PREFIX", "SignalTable", "Track", "is_update_ratio", "layer_name", "phase_of",
           "read_table", "summarize"]
