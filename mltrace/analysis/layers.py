"""Where a tensor sits in a model: its layer, the block a view of many tensors groups rows by
(``h.0``, ``layers.12``, ``Sequential_3``), and its kind, which tensors may share a colour
scale (a weight's norm is orders of magnitude above its gradient's: on one scale the gradients
all look alike).

Example:
    >>> layer_of("gradient/GPT2LMHeadModel_transformer.h.0.attn.c_attn.weight")
    'gradient/GPT2LMHeadModel_transformer.h.0'
    >>> kind_of("gradient/fc1.weight", ["all", "gradients"])
    'gradients'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mltrace.analysis.order import module_of
from mltrace.collections import GRADIENT_PREFIX, CollectionKeys

#: Kinds in the order a view shows their sections: the collections a tensor's kind is read
#: from, the first that holds it wins.
KIND_ORDER = (
    CollectionKeys.GRADIENTS, CollectionKeys.WEIGHTS, CollectionKeys.BIASES,
    CollectionKeys.OPTIMIZER_VARIABLES, CollectionKeys.OUTPUTS, CollectionKeys.INPUTS,
    CollectionKeys.LAYERS, CollectionKeys.LOSSES, CollectionKeys.METRICS,
    CollectionKeys.SM_METRICS,
)
#: Collections that hold every kind (they say nothing of a tensor's kind).
GENERIC = frozenset({CollectionKeys.ALL, CollectionKeys.DEFAULT})
#: The kind of a tensor in no collection that tells one.
OTHER = "other"
#: A part of a name that numbers a block: ``0`` (``h.0``) or ``Sequential_3``, ``dense_1``.
_NUMBERED = re.compile(r"(?:^|_)\d+$")
_PARTS = re.compile(r"[^./]+")


def layer_of(name: str) -> str:
    """The layer of tensor ``name``: its module (see ``order.module_of``) up to the first part
    that numbers a block, or the whole module when none does (``Net_fc1``, ``MSELoss``). It is a
    prefix of ``name`` (the gradient prefix kept), so rows of one layer share it.

    Example:
        >>> layer_of("Net_layers.12.mlp.fc1.weight"), layer_of("Sequential_3_output_0")
        ('Net_layers.12', 'Sequential_3')
    """
    lead = GRADIENT_PREFIX if name.startswith(GRADIENT_PREFIX) else ""
    module = module_of(name)
    for part in _PARTS.finditer(module):
        if _NUMBERED.search(part.group()):
            return lead + module[:part.end()]
    return lead + module


def kind_of(name: str, collections: Iterable[str]) -> str:
    """The kind of tensor ``name`` held by ``collections``: the first of KIND_ORDER among them,
    else ``gradients`` for a gradient's name, else the first other collection by name ("all"
    and "default" left out), else OTHER."""
    held = set(collections) - GENERIC
    for kind in KIND_ORDER:
        if kind in held:
            return kind
    if name.startswith(GRADIENT_PREFIX):
        return CollectionKeys.GRADIENTS
    return min(held) if held else OTHER


def kind_rank(kind: str) -> tuple[int, str]:
    """The sort key of a kind's section: KIND_ORDER first, the others by name, OTHER last."""
    if kind in KIND_ORDER:
        return KIND_ORDER.index(kind), kind
    return (len(KIND_ORDER) + 1 if kind == OTHER else len(KIND_ORDER)), kind
