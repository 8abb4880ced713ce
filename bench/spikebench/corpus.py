"""SpikeBench's training text: a seeded synthetic language, char-level, that needs no download.

Why synthetic: the text must be learnable (a healthy run's loss has to fall clearly, or a loss
spike means nothing) and the same on every machine and Python version; a random token stream is
not learnable, and the standard library's files differ between Python releases.

The language: a fixed vocabulary of ``WORDS`` made-up words (lowercase letters, lengths 1 to 9,
letters drawn with skewed frequencies); word frequencies follow Zipf's law (exponent
``ZIPF``); a bigram grammar gives every word ``SUCCESSORS`` likely next words (Zipf-weighted
among themselves), followed with probability ``FOLLOW`` (otherwise the next word is drawn from
the unigram law); sentences of 4 to 14 words, commas now and then, ending in ``.``, ``?`` or
``!``; a new line every few sentences. Everything is drawn from ``random.Random(CORPUS_SEED)``,
so the text is fixed: only where the batches are cut from it depends on a run's seed.

What there is to learn: spelling (a word's letters follow each other deterministically once it
has begun), word frequencies, the grammar, where punctuation falls. A uniform guess costs
ln(34) = 3.53 nats per character; the benchmark's model is at about 2.2 after 100 steps and 1.7
after 500.
"""

from __future__ import annotations

import functools
import random
import string

import torch

CORPUS_SEED = 20240917
CHARACTERS = 200_000
WORDS = 400
ZIPF = 1.1
SUCCESSORS = 6
FOLLOW = 0.8
#: The alphabet: every character the text uses, in a fixed order (a token is an index into it).
ALPHABET = " \n" + string.ascii_lowercase + ".,;:?!"


def _zipf_weights(n: int, exponent: float) -> list[float]:
    return [1.0 / (rank + 1) ** exponent for rank in range(n)]


def _vocabulary(rng: random.Random) -> list[str]:
    letters = list(string.ascii_lowercase)
    rng.shuffle(letters)
    letter_weights = _zipf_weights(len(letters), 0.5)
    words: set[str] = set()
    ordered: list[str] = []
    while len(ordered) < WORDS:
        length = min(9, 1 + int(rng.expovariate(1 / 3.5)))
        word = "".join(rng.choices(letters, letter_weights, k=length))
        if word not in words:
            words.add(word)
            ordered.append(word)
    return ordered


@functools.cache
def text() -> str:
    """The corpus: ``CHARACTERS`` characters of the synthetic language (the same every call)."""
    rng = random.Random(CORPUS_SEED)
    vocab = _vocabulary(rng)
    unigram = _zipf_weights(WORDS, ZIPF)
    successors = [rng.choices(range(WORDS), unigram, k=SUCCESSORS) for _ in range(WORDS)]
    follow_weights = _zipf_weights(SUCCESSORS, 1.0)
    parts: list[str] = []
    size = 0
    word = rng.choices(range(WORDS), unigram)[0]
    while size < CHARACTERS:
        sentence = []
        for position in range(rng.randint(4, 14)):
            if position and rng.random() < 0.08:
                sentence.append(",")
            if position:
                sentence.append(" ")
            sentence.append(vocab[word])
            if rng.random() < FOLLOW:
                word = rng.choices(successors[word], follow_weights)[0]
            else:
                word = rng.choices(range(WORDS), unigram)[0]
        sentence.append(rng.choices(".?!;:", (0.7, 0.12, 0.1, 0.05, 0.03))[0])
        sentence.append("\n" if rng.random() < 0.2 else " ")
        chunk = "".join(sentence)
        parts.append(chunk)
        size += len(chunk)
    return "".join(parts)[:CHARACTERS]


@functools.cache
def tokens() -> torch.Tensor:
    """The corpus as token ids (int64, one per character, indices into ``ALPHABET``)."""
    index = {c: i for i, c in enumerate(ALPHABET)}
    return torch.tensor([index[c] for c in text()], dtype=torch.int64)


def make_batches(steps: int, batch: int, context: int, seed: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (input, target) batches of ``batch`` windows of ``context`` characters cut at
    places drawn with ``seed``; the target is the input shifted by one character."""
    stream = tokens()
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - context - 1, (batch,), generator=gen).tolist()
        x = torch.stack([stream[s:s + context] for s in starts])
        y = torch.stack([stream[s + 1:s + 1 + context] for s in starts])
        batches.append((x, y))
    return batches
