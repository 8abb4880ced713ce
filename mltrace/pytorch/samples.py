"""Per-sample losses and input fingerprints of a PyTorch batch: what the ``samples``
collection holds (mltrace.stability.samples names and describes its tensors).

- Per-sample losses are recomputed from the inputs the loss module was called with, under
  ``torch.no_grad()``: torch.nn's own losses (whose forward honours ``reduction``) by a shallow
  copy with ``reduction="none"``, averaged over every dimension but the first; any other loss
  module by ``torch.func.vmap`` over dimension 0 of its tensor arguments, each sample a batch of
  one; failing that, by a loop over at most :data:`~mltrace.stability.samples.LOOP_LIMIT`
  samples. The module's ``forward`` is called directly, so no forward hook (the user's or
  mltrace's) runs for the recomputation.
- :func:`fingerprint` digests each sample (row along dimension 0) of a tensor, so that a saved
  batch can be found in a data pipeline by hashing its samples the same way.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.stability.samples import LOOP_LIMIT, MEAN_RTOL, ROW_BYTES_CAP

#: How per-sample losses can be computed, in the order they are tried.
METHODS = ("reduction", "vmap", "loop")


class NoPerSampleLoss(Exception):
    """The per-sample losses of a loss module cannot be computed; the message says what was
    tried and why each failed."""


def fingerprint(tensor: torch.Tensor) -> np.ndarray:
    """The fingerprint of each sample of ``tensor`` (its rows along dimension 0), as the
    ``samples/<model>/fingerprint`` tensor holds them for the registered model's input.

    BLAKE2b (8-byte digest) of the row's dtype, shape and bytes; a row over 64 KiB is hashed
    from an evenly strided sample of its elements (mltrace.stability.samples says exactly how).
    Equal rows give equal fingerprints whatever the device; any change of dtype or shape gives
    others.

    Args:
        tensor: a batch, samples along dimension 0 (the model's first tensor argument).

    Returns:
        An int64 array of one fingerprint per sample (the digest's bytes read as a
        little-endian signed integer).

    Raises:
        MltraceTypeError: not a torch.Tensor.
        MltraceValueError: a tensor of 0 dimensions (no samples).

    Example:
        >>> import mltrace.pytorch as smd
        >>> saved = trial.tensor("samples/GPT/fingerprint").value(12345)
        >>> for i, (x, y) in enumerate(loader):
        ...     if (smd.fingerprint(x) == saved).all():
        ...         print("the batch of step 12345 is batch", i)
    """
    rows, header = fingerprint_rows(tensor)
    return digests(rows.cpu().numpy(), header)


def fingerprint_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, bytes]:
    """What :func:`fingerprint` hashes, still on the tensor's device: a (batch, bytes) uint8
    copy of each row (or of its strided sample) and the header that goes before each row's
    bytes. A copy, so that the batch may change after this is taken.

    Raises:
        MltraceTypeError: not a torch.Tensor.
        MltraceValueError: a tensor of 0 dimensions.
    """
    if not isinstance(tensor, torch.Tensor):
        raise MltraceTypeError(f"fingerprint needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() == 0:
        raise MltraceValueError("fingerprint needs a batch (samples along dimension 0), got a "
                                "tensor of 0 dimensions; pass the whole batch")
    t = tensor.detach()
    shape = tuple(int(d) for d in t.shape[1:])
    header = f"{str(t.dtype).removeprefix('torch.')}:{'x'.join(map(str, shape))}:".encode()
    per_row = int(np.prod(shape, dtype=np.int64))
    rows = t.reshape(int(t.shape[0]), per_row)
    if per_row * t.element_size() > ROW_BYTES_CAP:
        cap = max(ROW_BYTES_CAP // t.element_size(), 1)
        rows = rows[:, ::-(-per_row // cap)]
    rows = rows.clone(memory_format=torch.contiguous_format)
    if rows.numel() == 0:  # no samples, or samples of no elements: nothing to view as bytes
        return rows.new_empty((rows.shape[0], 0), dtype=torch.uint8), header
    return rows.view(torch.uint8), header


def digests(rows: np.ndarray, header: bytes) -> np.ndarray:
    """BLAKE2b (8 bytes) of ``header`` and each row of ``rows`` (a (batch, bytes) uint8 host
    array), as little-endian int64."""
    out = bytearray()
    for row in rows:
        digest = hashlib.blake2b(header, digest_size=8)
        digest.update(row.tobytes())
        out += digest.digest()
    return np.frombuffer(bytes(out), dtype="<i8").astype(np.int64)


def reduces_itself(module: torch.nn.Module) -> bool:
    """True for torch.nn's own loss classes (not subclasses defined elsewhere), whose forward
    honours ``reduction``; a custom loss may keep the attribute and ignore it."""
    return (type(module).__module__ == "torch.nn.modules.loss"
            and isinstance(getattr(module, "reduction", None), str))


def per_sample_losses(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                      first: str | None = None) -> tuple[torch.Tensor, str]:
    """The loss of each sample of the batch ``module`` was called with (``args``,
    ``kwargs``), as a float32 vector, and the method that computed it (one of
    :data:`METHODS`; ``first``: the one to try first, the one that worked last time).

    Raises:
        NoPerSampleLoss: no method works; says what was tried and why each failed.
    """
    tried: list[str] = []
    order = [m for m in METHODS if m == first] + [m for m in METHODS if m != first]
    with torch.no_grad():
        for method in order:
            if method == "reduction" and not reduces_itself(module):
                continue
            try:
                return _METHODS[method](module, args, kwargs), method
            except Exception as exc:  # noqa: BLE001 - the user's loss may raise anything
                tried.append(f"{_DESCRIPTIONS[method]} ({type(exc).__name__}: {_first_line(exc)})")
    raise NoPerSampleLoss("; ".join(tried))


def is_mean_of(per_sample: np.ndarray, loss: float) -> bool:
    """True if the mean of ``per_sample`` is ``loss`` to a relative MEAN_RTOL: the loss is a
    plain mean over the samples (NaN and infinities agree with themselves)."""
    mean = float(np.mean(per_sample, dtype=np.float64)) if per_sample.size else float("nan")
    return bool(np.isclose(mean, loss, rtol=MEAN_RTOL, atol=0.0, equal_nan=True))


def _unreduced(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    clone = copy.copy(module)
    vars(clone)["reduction"] = "none"  # a plain attribute of torch's losses, in the copy's own dict
    out = clone.forward(*args, **kwargs)
    if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.numel() == 0:
        raise ValueError(f"reduction='none' returned {_describe(out)}, not one value per sample")
    return out.reshape(out.shape[0], -1).float().mean(dim=1)


def _batch(values: list[Any]) -> int:
    """The batch size: dimension 0 of the first tensor argument."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ValueError("no tensor argument has a batch dimension")


def _vmapped(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    values, call = _flat(module, args, kwargs)
    n = _batch(values)
    dims = tuple(0 if _batched(v, n) else None for v in values)

    def one(*sample: Any) -> torch.Tensor:
        return call([v.unsqueeze(0) if d == 0 else v for v, d in zip(sample, dims)])

    return torch.func.vmap(one, in_dims=dims)(*values).float()


def _looped(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    values, call = _flat(module, args, kwargs)
    n = _batch(values)
    if n > LOOP_LIMIT:
        raise ValueError(f"the batch of {n} samples is over the loop's limit of {LOOP_LIMIT}")
    batched = [_batched(v, n) for v in values]
    return torch.stack([call([v[i:i + 1] if b else v for v, b in zip(values, batched)])
                        for i in range(n)]).float()


def _flat(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
          ) -> tuple[list[Any], Callable[[list[Any]], torch.Tensor]]:
    """The call's arguments as one list, and a call of ``module.forward`` on such a list that
    returns its one-number result."""
    names, count = list(kwargs), len(args)

    def call(values: list[Any]) -> torch.Tensor:
        out = module.forward(*values[:count], **dict(zip(names, values[count:])))
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise ValueError(f"the loss of one sample is {_describe(out)}, not one number")
        return out.reshape(())

    return [*args, *kwargs.values()], call


def _batched(value: Any, n: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no message"


_METHODS = {"reduction": _unreduced, "vmap": _vmapped, "loop": _looped}
_DESCRIPTIONS = {"reduction": "a copy with reduction='none'", "vmap": "torch.func.vmap over dim 0",
                 "loop": f"a loop over at most {LOOP_LIMIT} samples"}


__all__ = ["METHODS", "NoPerSampleLoss", "digests", "fingerprint", "fingerprint_rows", "is_mean_of",
           "per_sample_losses", "reduces_itself"]
