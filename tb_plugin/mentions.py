"""Which tensors a rule's message names, and where: exact names, never parts of longer ones.

A message such as ``gradient/Sequential_0.bias holds NaN at step 300`` names the tensor
``gradient/Sequential_0.bias``; it does not name ``Sequential_0.bias``, although that text is in
it. A name counts where it stands alone: the character before it and the one after it are not
characters a tensor name is made of (letters, digits, ``_ . / : - [ ]``), except that a ``.``,
``:``, ``,`` or ``;`` right after it ends a sentence or a clause when a space or the end follows
(``... is NaN in dense/kernel:0.``). Where two names overlap, the longer one wins.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

#: Characters tensor names are made of: a name glued to one of them is part of a longer word.
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_./:-[]")
#: Punctuation that may end a sentence or clause right after a name.
_CLOSERS = frozenset(".:,;")


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is a whole name: no name character glued on either side."""
    if start > 0 and text[start - 1] in NAME_CHARS:
        return False
    if end == len(text) or text[end] not in NAME_CHARS:
        return True
    # "X." or "X:" closing a sentence or clause, not "X.bias" or "X:0"
    return text[end] in _CLOSERS and (end + 1 == len(text) or text[end + 1] not in NAME_CHARS)


def mentions(text: str | None, names: Iterable[str]) -> list[tuple[int, int, str]]:
    """Each place ``text`` names one of ``names`` exactly, as ``(start, end, name)`` in order;
    overlapping places keep the longer name (the panel links each place to its tensor).

    Args:
        text: a rule's message (None: no mention).
        names: the trial's tensor names.

    Returns:
        the mentions, by position, none overlapping.
    """
    if not text:
        return []
    found: list[tuple[int, int, str]] = []
    for name in names:
        if not name or name not in text:
            continue
        at = text.find(name)
        while at >= 0:
            if _stands_alone(text, at, at + len(name)):
                found.append((at, at + len(name), name))
            at = text.find(name, at + 1)
    kept: list[tuple[int, int, str]] = []
    for start, end, name in sorted(found, key=lambda m: m[0] - m[1]):  # longest first
        if all(end <= a or start >= b for a, b, _ in kept):
            kept.append((start, end, name))
    return sorted(kept)


def named_tensors(text: str | None, names: Iterable[str]) -> list[str]:
    """The tensors of ``names`` that ``text`` names exactly (see :func:`mentions`), each once,
    in the order they first appear."""
    return list(dict.fromkeys(name for _, _, name in mentions(text, names)))


__all__ = ["NAME_CHARS", "mentions", "named_tensors"]
