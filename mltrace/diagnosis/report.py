"""The diagnosis of a trial as data: what ``mltrace diagnose --json`` prints, what
``trial.diagnose()`` returns, and its text form.

The JSON is versioned (``schema``: ``mltrace.diagnosis/1``); its fields are documented in
docs/guide/diagnose.md, and a new version adds fields without changing the meaning of these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mltrace.diagnosis.causes import ADVICE, CauseFinding
from mltrace.diagnosis.detect import Anomaly, Departure
from mltrace.diagnosis.method import Method
from mltrace.diagnosis.table import layer_name
from mltrace.format.json_safe import json_safe

SCHEMA = "mltrace.diagnosis/1"
#: Tensors of the origin ranking kept in a report.
ORIGIN_TOP = 10


@dataclass
class Diagnosis:
    """A trial's diagnosis (see docs/guide/diagnose.md): the anomaly it explains, the onset, the
    origin ranking, the cause with its evidence and advice, and the thresholds used."""

    trial: str
    worker: str | None
    method: Method
    steps: tuple[int, int, int]  # count, first, last
    anomaly: Anomaly | None = None
    anomalies: list[Anomaly] = field(default_factory=list)
    origin: list[Departure] = field(default_factory=list)
    cause: CauseFinding | None = None
    damaged: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        """True when there was an anomaly to explain."""
        return self.anomaly is not None

    @property
    def onset(self) -> int | None:
        """The first step where something left its window (None without an anomaly)."""
        if self.origin:
            return self.origin[0].step
        return self.anomaly.step if self.anomaly is not None else None

    @property
    def cause_name(self) -> str | None:
        """The cause's class: numerics, optimizer, data, corruption or unexplained."""
        return self.cause.cause if self.cause is not None else None

    @property
    def origin_tensor(self) -> str | None:
        """The tensor that left its window first (None without one)."""
        return self.origin[0].tensor if self.origin else None

    @property
    def origin_layer(self) -> str | None:
        """The layer of the first tensor of the origin that has one."""
        for d in self.origin:
            layer = layer_name(d.tensor)
            if layer is not None:
                return layer
        return None

    def message(self) -> str:
        """One line: what happened, or that nothing did (with the thresholds)."""
        if self.anomaly is None:
            m = self.method
            return (f"no anomaly in {self.steps[0]} steps: no non-finite value, no loss or gradient-norm spike "
                    f"(robust z >= {m.z_anomaly:g} and {m.spike_ratio:g}x the median of {m.window} steps), "
                    f"no signal out of its window {m.sustain} steps in a row (robust z >= {m.z_deviation:g}), "
                    "no flight-recorder dump")
        where = f" in {self.origin_layer}" if self.origin_layer else ""
        return (f"step {self.anomaly.step}: {self.cause_name} — began at step {self.onset}{where} "
                f"({self.origin_tensor or self.anomaly.tensor})")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (schema ``mltrace.diagnosis/1``)."""
        cause = self.cause
        return {
            "schema": SCHEMA,
            "trial": self.trial,
            "worker": self.worker,
            "found": self.found,
            "message": self.message(),
            "steps": {"count": self.steps[0], "first": self.steps[1], "last": self.steps[2]},
            "anomaly": _anomaly(self.anomaly),
            "anomalies": [_anomaly(a) for a in self.anomalies],
            "onset": self.onset,
            "origin": [{"tensor": d.tensor, "layer": layer_name(d.tensor), "step": d.step, "phase": d.phase,
                        "z": json_safe(d.z), "value": json_safe(d.value), "window_median": json_safe(d.median)}
                       for d in self.origin[:ORIGIN_TOP]],
            "origin_layer": self.origin_layer,
            "cause": None if cause is None else {
                "class": cause.cause,
                "summary": cause.summary,
                "evidence": [{"cause": e.cause, "supports": e.supports, "text": e.text} for e in cause.evidence],
                "advice": ADVICE[cause.cause],
            },
            "samples": [] if cause is None else cause.samples,
            "record_next": [] if cause is None else cause.record_next,
            "method": self.method.to_dict(),
            "damaged": self.damaged[:20],
        }

    def to_text(self) -> str:
        """The report for a terminal."""
        lines = [f"trial {self.trial}" + (f" ({self.worker})" if self.worker else ""), self.message()]
        if self.anomaly is None:
            return "\n".join(lines)
        lines.append(f"anomaly: {self.anomaly.detail}")
        if self.origin:
            lines.append("origin (first out of its window, in execution order):")
            for d in self.origin[:5]:
                z = "not finite" if math.isinf(d.z) else f"robust z {d.z:+.1f}"
                lines.append(f"  step {d.step:>6}  {d.phase:<9} {d.tensor}  ({z})")
        cause = self.cause
        if cause is not None:
            lines.append(f"cause: {cause.cause}: {cause.summary}")
            for e in cause.evidence:
                lines.append(f"  {'+' if e.supports else '-'} {e.cause}: {e.text}")
            for s in cause.samples[:10]:
                lines.append(f"  sample {s['index']}: loss {s['loss']:.4g} (batch median {s['batch_median']:.4g})"
                             + (f", fingerprint {s['fingerprint']}" if "fingerprint" in s else ""))
            lines.append("what people usually do:")
            lines += [f"  - {a}" for a in ADVICE[cause.cause]]
            if cause.record_next:
                lines.append(f"not recorded (would tell more): {', '.join(cause.record_next)}")
        if self.damaged:
            lines.append(f"{len(self.damaged)} damaged record(s) skipped")
        return "\n".join(lines)


def _anomaly(a: Anomaly | None) -> dict[str, Any] | None:
    return None if a is None else {"step": a.step, "kind": a.kind, "tensor": a.tensor, "detail": a.detail}
