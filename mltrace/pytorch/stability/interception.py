"""Seeing a model's attention and gradient clipping without changing the model or the loop:
while a hook listens, ``torch.nn.functional.scaled_dot_product_attention`` and
``torch.nn.functional.softmax`` are replaced by wrappers that call torch's own function and then
tell the listening hooks what it was called with, and ``torch.nn.utils.clip_grad_norm_`` by one
that tells them first (the gradients before clipping: what a gradient-norm spike is measured
on), then clips.

Models that call them through the module attribute (``F.scaled_dot_product_attention(...)``,
``nn.functional.softmax(...)``: nanoGPT, Hugging Face Transformers' "sdpa" and "eager" attention,
torchtitan) are seen as they are; a model that imported the function itself before the hook was
created (``from torch.nn.functional import softmax``) is not. Inside a region that
``torch.compile`` traces, the wrappers are torch's function and nothing else (no graph break).
The originals are put back when the last listening hook closes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from mltrace.pytorch.compiled import compiling


class AttentionListener(Protocol):
    """What a hook implements to hear of attention calls."""

    def on_sdpa(self, query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None,
                is_causal: bool, scale: float | None) -> None:
        """A ``scaled_dot_product_attention`` call (its result already computed)."""

    def on_softmax(self, scores: torch.Tensor, probabilities: torch.Tensor) -> None:
        """A softmax over the last dimension of a 4-D tensor (batch, heads, queries, keys)."""

    def on_clip(self, parameters: list[torch.Tensor]) -> None:
        """``clip_grad_norm_`` is about to clip these parameters' gradients."""


_listeners: list[AttentionListener] = []
_originals: dict[str, Callable[..., Any]] = {}
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _sdpa(*args: Any, **kwargs: Any) -> Any:
    out = _originals["scaled_dot_product_attention"](*args, **kwargs)
    if not compiling() and _listeners:
        given = dict(zip(_SDPA_ARGS, args))
        given.update(kwargs)
        for listener in list(_listeners):
            listener.on_sdpa(given["query"], given["key"], given.get("attn_mask"),
                             bool(given.get("is_causal", False)), given.get("scale"))
    return out


def _softmax(*args: Any, **kwargs: Any) -> Any:
    out = _originals["softmax"](*args, **kwargs)
    if not compiling() and _listeners:
        scores = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if isinstance(scores, torch.Tensor) and scores.dim() == 4 and dim in (-1, 3):
            for listener in list(_listeners):
                listener.on_softmax(scores, out)
    return out


def _clip_grad_norm(parameters: Any, *args: Any, **kwargs: Any) -> Any:
    if not compiling() and _listeners:
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        for listener in list(_listeners):
            listener.on_clip(parameters)
    return _originals["clip_grad_norm_"](parameters, *args, **kwargs)


#: (module, function name) -> its wrapper
_WRAPPERS: dict[tuple[Any, str], Callable[..., Any]] = {
    (F, "scaled_dot_product_attention"): _sdpa, (F, "softmax"): _softmax,
    (torch.nn.utils, "clip_grad_norm_"): _clip_grad_norm,
}


def listen(listener: AttentionListener) -> None:
    """Tell ``listener`` of attention calls and clipping from now on (the wrappers go in with
    the first listener)."""
    if listener in _listeners:
        return
    if not _listeners:
        for (module, name), wrapper in _WRAPPERS.items():
            _originals[name] = getattr(module, name)
            setattr(module, name, wrapper)
    _listeners.append(listener)


def unlisten(listener: AttentionListener) -> None:
    """Stop telling ``listener``; with the last one gone, torch's functions are put back (unless
    something else replaced them since, which is then left in place)."""
    if listener not in _listeners:
        return
    _listeners.remove(listener)
    if not _listeners:
        for (module, name), wrapper in _WRAPPERS.items():
            if getattr(module, name) is wrapper:
                setattr(module, name, _originals.pop(name))


def calling_module(names: dict[int, str], depth: int = 3, limit: int = 24) -> str | None:
    """The name of the nearest registered module whose method is on the call stack (the
    attention module that called torch's function), looking at most ``limit`` frames up from
    ``depth`` frames above this one; None if there is none (a call from outside the model)."""
    frame = sys._getframe(depth)
    for _ in range(limit):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module):
                name = names.get(id(owner))
                if name is not None:
                    return name
        frame = frame.f_back  # type: ignore[assignment]
    return None


__all__ = ["AttentionListener", "calling_module", "listen", "unlisten"]
