"""What the PyTorch adapter needs to stay out of ``torch.compile``'s way.

- Step-boundary callbacks run eagerly. On a plain model (maybe compiled later) they are forward
  hooks wrapped with ``torch.compiler.disable``, so TorchDynamo never traces them; they are
  called from ``Module.__call__``, outside the compiled region, so skipping them costs no graph
  break. On what ``torch.compile`` returned, the boundary runs before the compiled call in the
  wrapper's ``forward`` attribute, outside Dynamo too (see TorchAdapter._attach_boundary).
- Module inputs and outputs inside a compiled region are recorded by a *traceable* forward hook:
  on a save step it appends detached tensors to a buffer; Dynamo guards on one boolean
  (``TracedIO.active``), so a compiled region has at most two graph variants (a save step and a
  skip step). The eager step-boundary hook drains the buffer after the model's forward.
- Wrappers are seen through for names: ``torch.compile``'s ``OptimizedModule`` and FSDP2's
  ``FSDP<Class>`` name tensors as the plain model does, so compiled, sharded and eager runs of
  one model write the same tensor names.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class TracedIO:
    """Module inputs/outputs recorded inside a compiled region, saved after the forward returns.

    ``active`` says whether the current step saves anything (set when a step begins): every
    module and gradient callback reads it first and returns at once when it is False, and the
    traced hook's branch on it is what Dynamo guards. ``buffer`` holds
    ``(module name, suffix, tensors)`` in call order.
    """

    active: bool = False
    buffer: list[tuple[str, str, list[torch.Tensor]]] = field(default_factory=list)

    def take(self) -> list[tuple[str, str, list[torch.Tensor]]]:
        """The recorded tensors, emptying the buffer (the same list object stays in place, so a
        compiled graph's guard on it holds)."""
        taken = list(self.buffer)
        self.buffer.clear()
        return taken


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``), else ``module``."""
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else module


def class_name(module: torch.nn.Module) -> str:
    """The model's own class name: FSDP2's ``fully_shard`` swaps the class for a subclass
    ``FSDP<Class>``; the name is the first class of the MRO that is not such a wrapper."""
    for cls in type(module).__mro__:
        if not _is_fsdp_class(cls):
            return cls.__name__
    return type(module).__name__


def _is_fsdp_class(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return cls.__name__.startswith("FSDP") and module.startswith("torch.distributed")


def eager_only(fn: F) -> F:
    """``fn`` made invisible to TorchDynamo (it always runs as plain Python). Imports
    ``torch._dynamo`` (about 0.7 s, once per process) when the first model is registered."""
    disabled = torch.compiler.disable(fn, recursive=True)
    return cast(F, functools.wraps(fn)(disabled))


#: True while TorchDynamo traces the calling code (a constant to the tracer). Torch's own
#: function, not wrapped in one of ours: every module callback of a step that saves asks it,
#: and each Python call costs about a microsecond in place.
compiling: Callable[[], bool] = torch.compiler.is_compiling


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors in ``value`` and its (nested) tuples and lists, in order; anything else is
    skipped (as smdebug). Traceable by TorchDynamo."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def detached(value: Any) -> list[torch.Tensor]:
    """:func:`tensors_in`, detached (what a traced hook may keep past the graph)."""
    return [t.detach() for t in tensors_in(value)]


_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)  # private, no public equivalent


def in_backward() -> bool:
    """True inside the autograd engine (a backward pass): activation checkpointing re-runs
    forward there, and its outputs must not be saved a second time."""
    return _graph_task_id is not None and _graph_task_id() != -1
