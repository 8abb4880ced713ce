"""What the flight recorder keeps and when it dumps: ``FlightRecorderConfig`` (the hook option
``flight_recorder=`` and the JSON configuration's ``"FlightRecorder"`` key), its byte
accounting, and the check of its collections against a hook's.

The recorder itself is mltrace.capture.flight_recorder; this module holds only what a
configuration is, so that options and the JSON reader need not import the recorder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from mltrace.capture.adapter import ReductionItems
from mltrace.collections import Collection
from mltrace.config import ReductionConfig, parse_flag
from mltrace.exceptions import MltraceValueError

#: What the recorder keeps of each tensor unless told: min and max. Together they are the
#: non-finite check (a NaN or an infinity anywhere shows in one of them) and the range a tensor
#: spans, from one ``aminmax`` kernel per tensor, computed as the tensor comes: no copy of it,
#: which on a CPU costs more than the kernel (measured on a transformer step). More
#: (mean, std, l2, ...) costs a copy of every recorded tensor per step on PyTorch (the copies are
#: reduced only when a step is read): ask for them with ``reductions=``.
DEFAULT_REDUCTIONS = ("min", "max")
#: bytes kept per recorded reduction (a float64) and per recorded tensor (its name and bookkeeping)
REDUCTION_BYTES = 8
TENSOR_OVERHEAD_BYTES = 64
#: a non-finite value of either reduction means the tensor held a NaN or an infinity (min and
#: max propagate NaN); every recorded tensor keeps both
_CHECK_ITEMS = (("min", False), ("max", False))


@dataclass
class FlightRecorderConfig:
    """What the flight recorder keeps and when it dumps (hook option ``flight_recorder=``).

    Attributes:
        steps: N, how many steps before a trigger are kept (at most; the budget may hold fewer).
        after_steps: K, how many steps after a trigger are written at full resolution.
        collections: the recorded collections (names); None records every collection the hook
            saves. Any collection of the hook may be named, saved or not.
        reductions: what is kept of each tensor (mltrace's reduction names, ``abs_`` prefix and
            ``l1``/``l2`` norms included); ``min`` and ``max`` are kept always, for the
            non-finite check. Tensors of scalar collections (losses, metrics) keep their value.
        raw: also keep a copy of each tensor (on its device), within the budget.
        memory_budget: bytes the kept steps may take (reductions: 8 bytes each; raw copies their
            size; a framework's slots for copies of the steps' tensors, when they fit in half of
            it: see mltrace.pytorch.copy_ring); past it the oldest step is dropped, the recorder
            never grows.
        nonfinite: dump when a recorded tensor holds a NaN or an infinity (armed again once a
            step is finite).
        loss_spike: k; dump when a loss exceeds k times its running median over the last
            ``loss_window`` steps (only for positive medians; None turns it off).
        loss_window: M, the steps of that median; the check starts once M losses were seen.
        on_exception: dump when an exception escapes the training script (sys.excepthook).
        max_dumps: dumps per run; later triggers are logged only (a NaN run would dump forever).
        samples: also keep, whole, the ``samples`` collection's tensors of each recorded step
            (each sample's loss and input fingerprint: batch-sized vectors, counted in the
            budget; see mltrace.stability.samples), so a dump says which batch and which samples
            broke training; whatever ``collections`` says. The PyTorch hook computes them once a
            model and a loss are registered. Off by default: recomputing the loss per sample
            every step costs more than the rest of the recorder's defaults together (measured
            on a small transformer's step).
        diagnose: after each dump that a trigger made (not one asked for by hand), once its
            ``after_steps`` are written (or at close, if training ends first), diagnose the
            trial on a background thread and publish the report (mltrace.diagnosis.publish:
            ``mltrace_diagnosis/<worker>.json``, the log, the MLflow run's tags), so the run says
            why it broke without anyone running ``mltrace diagnose``; see
            mltrace.capture.flight_recorder_diagnosis.
    """

    steps: int = 50
    after_steps: int = 10
    collections: list[str] | None = None
    reductions: list[str] = field(default_factory=lambda: list(DEFAULT_REDUCTIONS))
    raw: bool = False
    memory_budget: int = 64 * 1024 * 1024
    nonfinite: bool = True
    loss_spike: float | None = 10.0
    loss_window: int = 50
    on_exception: bool = True
    max_dumps: int = 5
    samples: bool = False
    diagnose: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "after_steps", "loss_window", "max_dumps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise MltraceValueError(
                    f"FlightRecorderConfig({name}={value!r}): must be a whole number above 0")
        budget = self.memory_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise MltraceValueError(
                f"FlightRecorderConfig(memory_budget={budget!r}): a number of bytes above 0, e.g. "
                "64 * 1024 * 1024")
        if self.loss_spike is not None and (isinstance(self.loss_spike, bool) or
                                            not isinstance(self.loss_spike, (int, float))
                                            or not self.loss_spike > 1):
            raise MltraceValueError(
                f"FlightRecorderConfig(loss_spike={self.loss_spike!r}): a factor above 1 (a loss "
                "above factor x its running median triggers a dump), or None to turn it off")
        if self.collections is not None:
            if isinstance(self.collections, str):
                self.collections = [self.collections]
            self.collections = [str(c) for c in self.collections]
            if not self.collections:
                raise MltraceValueError("FlightRecorderConfig(collections=[]): name at least one "
                                        "collection, or None for every saved collection")
        if isinstance(self.reductions, str):
            self.reductions = [r.strip() for r in self.reductions.split(",") if r.strip()]
        self.reductions = list(self.reductions)
        self.items  # noqa: B018 - an unknown reduction is reported here, at construction

    @property
    def items(self) -> ReductionItems:
        """The (reduction, abs) pairs kept of each tensor (min and max always among them)."""
        parsed = ReductionConfig.from_dict({"reductions": ",".join(self.reductions)})
        assert parsed is not None
        items = parsed.items()
        return items + [i for i in _CHECK_ITEMS if i not in items]

    def step_bytes(self, tensors: Iterable[int]) -> int:
        """Bytes one step takes for tensors of these byte sizes."""
        per = entry_bytes(len(self.items))
        return sum(per + (nbytes if self.raw else 0) for nbytes in tensors)

    @classmethod
    def parse(cls, value: Any, where: str = "flight_recorder") -> FlightRecorderConfig | None:
        """A FlightRecorderConfig from itself, a dict of its fields (the JSON config's form),
        True (the defaults), or None/False (no recorder).

        Raises:
            MltraceValueError: another type, an unknown field (named, with the valid ones) or
                an invalid value.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise MltraceValueError(
                    f"{where}: unknown key(s) {unknown}; valid keys: "
                    f"{', '.join(cls.__dataclass_fields__)}")
            return cls(**{k: _coerce(k, v, where) for k, v in value.items()})
        raise MltraceValueError(
            f"{where}={value!r}: pass a FlightRecorderConfig(steps=50, ...), a dict of its fields, "
            "or True for the defaults")


def entry_bytes(reductions: int) -> int:
    """What the recorder counts for one tensor of one step keeping ``reductions`` values (raw
    copies come on top)."""
    return reductions * REDUCTION_BYTES + TENSOR_OVERHEAD_BYTES


_INT_FIELDS = ("steps", "after_steps", "memory_budget", "loss_window", "max_dumps")
_FLAG_FIELDS = ("raw", "nonfinite", "on_exception", "samples", "diagnose")


def _coerce(key: str, value: Any, where: str) -> Any:
    """A JSON config's value as the field's type: SageMaker-era files hold strings ("50",
    "true", "min,max")."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        if key in _INT_FIELDS:
            return int(text)
        if key == "loss_spike":
            return None if text.lower() in ("", "none", "null", "off") else float(text)
    except ValueError:
        raise MltraceValueError(f"{where}.{key}={value!r} is not a number") from None
    if key in _FLAG_FIELDS:
        return parse_flag(f"{where}.{key}", text)
    if key in ("collections", "reductions"):
        return [t.strip() for t in text.split(",") if t.strip()]
    return value


def check_collections(names: Iterable[str], known: AbstractSet[str] | Mapping[str, Collection]) -> None:
    """Raise if a recorded collection is not one of the hook's (``known``: their names, or the
    hook's collections by name).

    Raises:
        MltraceValueError: naming it and the hook's collections.
    """
    import difflib

    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            raise MltraceValueError(
                f"FlightRecorderConfig(collections=[..., {name!r}]): the hook has no collection "
                f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "") + "; create it "
                f"before building the hook (get_collection({name!r}).include(regex)) or record one "
                f"of: {', '.join(sorted(known))}")


__all__ = ["FlightRecorderConfig", "DEFAULT_REDUCTIONS", "check_collections", "entry_bytes"]
