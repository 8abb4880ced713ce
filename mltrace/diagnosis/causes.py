"""Why a run broke: the cause the recorded tensors point to, with the evidence for and against
each cause, and what people usually do about it.

The causes, and what points to each (the rules are applied in this order; the first that holds
names the cause, and every cause's evidence is reported):

- **numerics**: the origin held a NaN or an infinity while every tensor before it in the step
  was finite (an overflow in that operation), or the origin is an attention logit or an output
  logit that grew over several steps (attention-logit growth, logit drift: softmax saturation).
- **optimizer**: the origin is the optimizer's own output: update-to-weight ratios or Adam's
  state left their windows before any module output, gradient or loss did (a learning-rate
  jump, an epsilon that dominates sqrt(v_hat), a second moment gone stale).
- **data**: the loss (or the model's output) left its window while no module output had; or the
  first modules of the forward pass did, for one or two steps only, with the optimizer normal
  before (an odd batch of inputs). Per-sample losses, where recorded, name the samples that
  stand out, and the batch's fingerprints where to find them.
- **corruption**: a module's output (or a weight) jumped by ``jump_ratio`` or more from a normal
  value the step before, and stayed there, while the optimizer's updates of the step before
  were normal: a weight changed by more than any update explains (a flipped bit, a bad write),
  which would not come back on a rerun.
- **unexplained**: none of the above holds with what was recorded; the report says which
  collections would tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mltrace.diagnosis.detect import Departure, Scores
from mltrace.diagnosis.method import Method
from mltrace.diagnosis.table import SAMPLES_PREFIX, SignalTable, is_update_ratio, layer_name
from mltrace.stability.signals import parse_signal

CAUSES = ("numerics", "optimizer", "data", "corruption", "unexplained")

#: What people usually do about each cause: advice, in one line each, not a cure.
ADVICE: dict[str, list[str]] = {
    "numerics": [
        "compute the overflowing operation in float32 or bfloat16 (autocast keeps softmax, norms and losses in float32)",
        "for attention-logit growth: QK-norm (normalise queries and keys) or QK-clip; for output-logit drift: a z-loss on log Z",
        "lower the learning rate or lengthen its warm-up; clip gradients",
    ],
    "optimizer": [
        "check the learning-rate schedule at that step (a jump, a restart, a unit mistake); lower or warm up the rate",
        "Adam: an epsilon near sqrt(v_hat) stalls updates: use 1e-8 or smaller; "
        "beta2 close to 1 keeps a stale second moment: 0.95-0.999",
        "clip gradients (clip_grad_norm_) so one step cannot move the weights far",
    ],
    "data": [
        "skip or drop the batch (find it by its fingerprints: mltrace.pytorch.fingerprint) and check its source shard",
        "check the labels and the padding of the samples that stand out; filter such samples in the pipeline",
        "rewind to a checkpoint before the step and skip the batch, as large runs do",
    ],
    "corruption": [
        "rerun from the last checkpoint: a silent corruption does not come back on a rerun",
        "if it does come back at the same step, look for code that writes into the weights outside the optimizer",
        "check the machine (ECC errors, a failing GPU); compare checksums of the weights across replicas",
    ],
    "unexplained": [
        "record more next time: include_collections=['stability'] (updates, Adam's state, attention, activations, samples)",
        "turn on the flight recorder (flight_recorder=True) to keep every step before the next failure",
    ],
}


@dataclass
class Evidence:
    """One observation, for or against a cause."""

    cause: str
    supports: bool
    text: str


@dataclass
class CauseFinding:
    """The cause named and the evidence gathered for every cause."""

    cause: str
    summary: str
    evidence: list[Evidence] = field(default_factory=list)
    samples: list[dict[str, object]] = field(default_factory=list)
    record_next: list[str] = field(default_factory=list)


def explain(table: SignalTable, scores: Scores, method: Method, ranked: list[Departure],
            anomaly_tensor: str | None = None) -> CauseFinding:
    """The cause the departures ``ranked`` (origin first) point to (see module docstring);
    ``anomaly_tensor`` is the tensor that made the anomaly, if one did."""
    finding = CauseFinding("unexplained", "")
    finding.samples = _standout_samples(table, method, ranked[0].step if ranked else None)
    finding.record_next = _missing(table)
    if not ranked:
        finding.summary = "nothing left its window before the anomaly"
        return finding
    origin = ranked[0]
    at_onset = [d for d in ranked if d.step == origin.step]
    optimizer = [d for d in at_onset if d.phase == "optimizer"]
    before = _updates_before(table, scores, origin.step)
    ev = finding.evidence
    if before is not None:
        ev.append(Evidence("optimizer", before[0] > 0.5, before[1]))
        ev.append(Evidence("corruption", before[0] <= 0.5, before[1]))
    if optimizer:
        ev.append(Evidence("optimizer", True, _optimizer_text(optimizer, table)))
    bad = [d for d in ranked if np.isinf(d.z)]
    if bad:
        ev.append(Evidence("numerics", True, f"the first non-finite value is {bad[0].tensor} at step {bad[0].step} "
                                             f"({bad[0].phase})"))
    if finding.samples:
        ev.append(Evidence("data", True, f"{len(finding.samples)} sample(s) of the batch at step {origin.step} "
                                         f"have a loss {method.sample_ratio:g} times the batch median or more"))
    persistent = _persists(table, scores, origin)
    jump = _jump(table, scores, method, origin)
    signal = parse_signal(origin.tensor)
    cause, summary = "unexplained", f"{origin.tensor} left its window first, at step {origin.step}"
    if np.isinf(origin.z):
        cause, summary = "numerics", (f"{origin.tensor} overflowed (NaN or infinity) at step {origin.step} while "
                                      "every tensor before it in the step was finite")
    elif origin.phase == "optimizer" or (origin.phase == "backward" and (
            _most_updates(optimizer, table) or anomaly_tensor in {d.tensor for d in optimizer})):
        cause, summary = "optimizer", _optimizer_text(optimizer or [origin], table)
    elif origin.phase in ("loss", "output") and signal is None:
        cause, summary = "data", (f"the loss jumped at step {origin.step} ({_times(origin)}) while no module output "
                                  "had left its window: the batch's targets")
    elif signal is not None and signal.collection in ("attention", "logits") and not jump:
        cause = "numerics"
        what = "attention-logit growth" if signal.collection == "attention" else "output-logit drift"
        summary = f"{what}: {origin.tensor} grew out of its window from step {origin.step} ({_times(origin)})"
    elif origin.phase in ("forward", "weights", "output", "loss"):
        first_module = _is_first(table, origin)
        if first_module and not persistent:
            cause, summary = "data", (f"the first modules' outputs left their windows at step {origin.step} "
                                      f"({origin.tensor}, {_times(origin)}) and came back: the batch's inputs")
        elif jump and (before is None or before[0] <= 0.5):
            cause, summary = "corruption", (f"{origin.tensor} jumped {_times(origin)} at step {origin.step} and stayed, "
                                            "with normal updates the step before: a weight changed outside the optimizer")
        elif signal is not None and signal.collection in ("attention", "logits"):
            cause, summary = "numerics", f"{origin.tensor} grew out of its window from step {origin.step}"
    ev.append(Evidence("data", cause == "data", f"the origin is in the {origin.phase} phase"
                       + (", in the first modules run" if _is_first(table, origin) else "")))
    ev.append(Evidence("corruption", jump and persistent, f"{origin.tensor} {'jumped' if jump else 'did not jump'} "
                       f"({_times(origin)}) and {'stayed' if persistent else 'came back'}"))
    finding.cause, finding.summary = cause, summary
    return finding


def _times(d: Departure) -> str:
    if not np.isfinite(d.value) or not d.median:
        return "not finite" if not np.isfinite(d.value) else f"robust z {d.z:.1f}"
    return f"{d.value / d.median:.3g} times its window's median"


def _jump(table: SignalTable, scores: Scores, method: Method, d: Departure) -> bool:
    """True when ``d``'s tensor jumped at its step: ``jump_ratio`` times its median, from a value
    the step before that was within its window."""
    row = table.index_of(d.step)
    if row is None or not np.isfinite(d.value) or not d.median:
        return False
    ratio = abs(d.value / d.median)
    before_ok = row == 0 or not scores.out[d.tensor][row - 1]
    return before_ok and (ratio >= method.jump_ratio or ratio <= 1 / method.jump_ratio)


def _persists(table: SignalTable, scores: Scores, d: Departure, steps: int = 3) -> bool:
    """True when ``d``'s tensor is still out of its window in most of the next ``steps`` steps
    that were recorded (a batch's effect passes; a corrupted weight's stays)."""
    row = table.index_of(d.step)
    if row is None:
        return False
    after = scores.out[d.tensor][row + 1: row + 1 + steps]
    return bool(after.size) and int(after.sum()) * 2 > after.size


def _is_first(table: SignalTable, d: Departure) -> bool:
    """True when ``d``'s tensor belongs to the first layer the forward pass runs (its layer has
    the lowest number, or it has no numbered layer: an embedding)."""
    if d.phase not in ("forward", "weights"):
        return False
    if layer_name(d.tensor) is None:
        return True
    numbers = [n for n in (_layer_number(layer_name(name)) for name, t in table.tracks.items() if t.phase == d.phase)
               if n is not None]
    return bool(numbers) and _layer_number(layer_name(d.tensor)) == min(numbers)


def _layer_number(layer: str | None) -> int | None:
    if layer is None:
        return None
    digits = layer.rsplit(".", 1)[-1]
    return int(digits) if digits.isdigit() else None


def _updates_before(table: SignalTable, scores: Scores, step: int) -> tuple[float, str] | None:
    """The share of update-to-weight ratios out of their windows the step before ``step`` (None
    when no ratio was recorded then), and a sentence saying so."""
    row = table.index_of(step)
    names = table.update_ratios
    if row is None or row == 0 or not names:
        return None
    out = sum(bool(scores.out[n][row - 1]) for n in names)
    share = out / len(names)
    return share, (f"{out} of {len(names)} update-to-weight ratios were out of their windows at step "
                   f"{int(table.steps[row - 1])}, the step before")


def _most_updates(departures: list[Departure], table: SignalTable) -> bool:
    """True when more than half of the update-to-weight ratios left their windows in
    ``departures`` (the optimizer moved every parameter differently at once)."""
    total = len(table.update_ratios)
    moved = sum(1 for d in departures if is_update_ratio(d.tensor) and np.isfinite(d.z))
    return total > 0 and moved * 2 > total


def _optimizer_text(departures: list[Departure], table: SignalTable) -> str:
    """What the optimizer's departing tensors say, in a sentence."""
    d = departures[0]
    kinds = {x.tensor.rsplit("/", 1)[-1] for x in departures}
    ratios = [x for x in departures if is_update_ratio(x.tensor)]
    total = len(table.update_ratios)
    parts = [f"the optimizer's step {d.step} left its window before anything else did"]
    if ratios:
        factors = [x.value / x.median for x in ratios if x.median and np.isfinite(x.value)]
        moved = f" (median x{np.median(factors):.3g})" if factors else " (not finite)"
        parts.append(f"{len(ratios)} of {total} update-to-weight ratios moved{moved}")
    if "eps_fraction" in kinds:
        parts.append("Adam's epsilon dominates sqrt(v_hat) (eps_fraction rose)")
    if "grad_sq_ratio" in kinds:
        parts.append("Adam's second moment went stale (mean g^2 / mean v_hat fell)")
    return "; ".join(parts)


def _standout_samples(table: SignalTable, method: Method, step: int | None) -> list[dict[str, object]]:
    """The samples of the batch at ``step`` whose loss is ``sample_ratio`` times the batch's
    median or more, with their fingerprints where recorded."""
    if step is None:
        return []
    out: list[dict[str, object]] = []
    for name, by_step in table.vectors.items():
        if not name.endswith("/loss") or step not in by_step:
            continue
        losses = by_step[step].astype(np.float64)
        median = float(np.median(losses)) if losses.size else 0.0
        fingerprints = next((v[step] for n, v in table.vectors.items()
                             if n.endswith("/fingerprint") and step in v), None)
        for i in np.flatnonzero(~np.isfinite(losses) | (losses >= method.sample_ratio * max(median, 1e-12))):
            sample: dict[str, object] = {"index": int(i), "loss": float(losses[i]), "batch_median": median}
            if fingerprints is not None and i < len(fingerprints):
                sample["fingerprint"] = f"{int(np.int64(fingerprints[i]).view(np.uint64)):016x}"
            out.append(sample)
    return out


def _missing(table: SignalTable) -> list[str]:
    """Collections whose absence keeps a cause from being told (to record next time)."""
    names = table.tracks.keys()
    wanted = {"updates": "updates/", "optimizer_state": "optimizer_state/",
              "activation_outliers": "activations/", "attention": "attention/", "samples": SAMPLES_PREFIX}
    return [c for c, prefix in wanted.items() if not any(n.startswith(prefix) for n in names)]
