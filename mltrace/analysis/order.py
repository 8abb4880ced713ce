"""Tensor names in model order: the order the model ran its layers, as the trial's records show
it, so that a view of every layer (the overview's rows, a comparison) reads from the input to the
output instead of as text (``Sequential_0, _10, _100, _102`` breaks a pattern over depth into
stripes).

No file of a trial says in what order the model runs its modules; the records do:

- each step's events file holds its records in the order the hook wrote them. Parameters come
  in the order the model registered them; gradients (``gradient/<param>`` of the PyTorch and
  MXNet hooks) as the backward pass made them: the last layer first. Reversed, the gradients are
  the forward pass, the order of execution.
- so the module order is the gradients' (reversed when they run against the layers' numbering,
  as a backward pass does), with the modules only the other names' records have put after the
  module they follow in those records; a name the records do not place goes last, in natural
  order. Ordering one kind of tensor at a time (weights, outputs) keeps those records apart.

Within a module, names sort naturally (``_2`` before ``_10``: :func:`natural_key`).

Example:
    >>> sorted(["Sequential_10.weight", "Sequential_2.weight"], key=natural_key)
    ['Sequential_2.weight', 'Sequential_10.weight']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from mltrace.collections import GRADIENT_PREFIX
from mltrace.exceptions import TensorUnavailable

if TYPE_CHECKING:
    from mltrace.trials import Trial
    from mltrace.trials.index import TensorEntries

_DIGITS = re.compile(r"(\d+)")
_IO_SUFFIX = re.compile(r"_(?:output|input)_\d+$")
#: (first global step, worker, byte offset in that step's events file) of a tensor's first record
Position = tuple[int, str, int]


def natural_key(name: str) -> tuple[tuple[str | int, ...], str]:
    """The sort key of ``name`` with its runs of digits compared as numbers (``layer_2`` before
    ``layer_10``), case-insensitively, ties broken by the name itself.

    Text and number parts alternate from a text part (maybe empty), so keys of two names compare
    text with text and number with number.

    Example:
        >>> sorted(["h.10.mlp", "h.9.mlp", "H.1.mlp"], key=natural_key)
        ['H.1.mlp', 'h.9.mlp', 'h.10.mlp']
    """
    parts = _DIGITS.split(name)
    return tuple(int(p) if k % 2 else p.lower() for k, p in enumerate(parts)), name


def natural_sorted(names: Iterable[str]) -> list[str]:
    """``names`` in natural order (see :func:`natural_key`)."""
    return sorted(names, key=natural_key)


def module_of(name: str) -> str:
    """The module a tensor name belongs to: the name without the gradient prefix and without its
    parameter (``gradient/Net_fc1.weight`` -> ``Net_fc1``) or its output/input suffix
    (``Net_fc1_output_0`` -> ``Net_fc1``); a name of neither form is its own module."""
    if name.startswith(GRADIENT_PREFIX):
        name = name[len(GRADIENT_PREFIX):]
    stripped = _IO_SUFFIX.sub("", name)
    if stripped != name:
        return stripped
    head, dot, _ = name.rpartition(".")
    return head if dot and "/" not in name[len(head):] else name


def _first_position(entries: TensorEntries, first_step: int | None) -> Position | None:
    """Where the first record of one tensor lies (None when it has only shapes)."""
    tables = (entries.values, entries.reductions)
    if first_step is not None and any(first_step in t for t in tables):
        step = first_step
    else:
        found = [min(t) for t in tables if t]
        if not found:
            return None
        step = min(found)
    starts: dict[str, int] = {}
    for worker, loc in entries.values.get(step, {}).items():
        starts[worker] = min(starts.get(worker, loc.start), loc.start)
    for worker, by_reduction in entries.reductions.get(step, {}).items():
        for loc in by_reduction.values():
            starts[worker] = min(starts.get(worker, loc.start), loc.start)
    worker = min(starts)
    return step, worker, starts[worker]


def record_positions(trial: Trial, names: Iterable[str]) -> dict[str, Position]:
    """Where the first record of each of ``names`` lies in the trial, as what sorts in the order
    the hook wrote them: ``(first global step, worker, byte offset)``. Names without a record
    (a saved shape only, or unknown) are left out. Reads the index only, no record."""
    saved = trial.saved_steps()
    first = saved[0] if saved else None
    out: dict[str, Position] = {}
    for name in names:
        try:
            entries = trial.index_entries(name)
        except TensorUnavailable:
            continue
        found = _first_position(entries, first)
        if found is not None:
            out[name] = found
    return out


def _modules_in_order(names: Sequence[str]) -> list[str]:
    """The modules of ``names`` (in record order) in the order they first appear."""
    return list(dict.fromkeys(module_of(n) for n in names))


def _against_numbering(modules: Sequence[str]) -> bool:
    """Whether ``modules`` run against their natural order more often than along it (a backward
    pass over layers numbered from the input); a tie counts as against, as the hooks that name
    gradients save them from the backward pass."""
    keys = [natural_key(m) for m in modules]
    along = sum(a < b for a, b in zip(keys, keys[1:]))
    against = sum(a > b for a, b in zip(keys, keys[1:]))
    return against >= along


def _merge(primary: list[str], secondary: Sequence[str]) -> list[str]:
    """``primary``, with each module only ``secondary`` has put right after the one it follows
    in ``secondary`` (at the start when it follows none that ``primary`` has); the modules after
    the last one they share go at the end (a loss comes after every layer)."""
    placed = set(primary)
    shared = [k for k, module in enumerate(secondary) if module in placed]
    tail = shared[-1] if shared else -1
    out = list(primary)
    at = {module: k for k, module in enumerate(out)}
    inserted: dict[int, list[str]] = {}  # index in primary (-1: the start) -> modules after it
    after = -1
    for k, module in enumerate(secondary):
        if module in placed:
            after = at[module]
        elif k > tail:
            out.append(module)
            placed.add(module)
        else:
            inserted.setdefault(after, []).append(module)
            placed.add(module)
    if not inserted:
        return out
    merged = list(inserted.get(-1, []))
    for k, module in enumerate(out):
        merged += [module, *inserted.get(k, [])]
    return merged


def module_order(trial: Trial, names: Iterable[str] | None = None) -> list[str]:
    """The modules of ``names`` (default: every tensor of the trial) in the order the model ran
    them (see the module docstring): the modules of the trial's gradients as the forward pass met
    them, each other module of ``names`` right after the module it follows in the records of
    ``names`` (so the outputs of layers without parameters fall between those with them)."""
    every = trial.tensor_names()
    grads = record_positions(trial, [n for n in every if n.startswith(GRADIENT_PREFIX)])
    gradients = _modules_in_order(sorted(grads, key=lambda n: grads[n]))
    if _against_numbering(gradients):
        gradients.reverse()
    own = record_positions(trial, [n for n in (every if names is None else names)
                                   if not n.startswith(GRADIENT_PREFIX)])
    return _merge(gradients, _modules_in_order(sorted(own, key=lambda n: own[n])))


def model_order(trial: Trial, names: Iterable[str]) -> list[str]:
    """``names`` in model order: by their module's place in :func:`module_order`, then in
    natural order within a module; names whose module the records do not place come last, in
    natural order.

    Args:
        trial: the trial whose records give the order (its index only is read).
        names: tensor names of the trial (any subset, e.g. one collection's).

    Returns:
        The same names, each once, in model order.

    Example:
        >>> model_order(trial, ["gradient/Sequential_10.weight", "gradient/Sequential_2.weight"])
        ['gradient/Sequential_2.weight', 'gradient/Sequential_10.weight']
    """
    names = list(dict.fromkeys(names))
    rank = {module: k for k, module in enumerate(module_order(trial, names))}
    last = len(rank)

    def key(name: str) -> tuple[int, tuple[tuple[str | int, ...], str]]:
        return rank.get(module_of(name), last), natural_key(name)

    return sorted(names, key=key)
