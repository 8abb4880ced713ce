"""The ``samples`` collection: which batch, and which samples of it, a step trained on.

A loss spike or a NaN names a step; a root-cause report also needs the batch and the samples
that caused it. Two tensors per step hold that, saved like any other (the PyTorch hook computes
them, mltrace.pytorch.samples; the ``stability`` switch saves them with the signals, and a
flight recorder keeps them whole for the steps it records):

==================================  ==========================================  =======  ========
tensor                              what it holds                               dtype    shape
==================================  ==========================================  =======  ========
``samples/<loss>/loss``             the loss of each sample of the batch        float32  (batch,)
``samples/<model>/fingerprint``     a digest of each sample of the model's      int64    (batch,)
                                    input (see below)
==================================  ==========================================  =======  ========

``<loss>`` is the registered loss module's name (its class, as in ``<loss>_output_0``),
``<model>`` the registered model's root name (its class). Index ``i`` of both is the ``i``-th
sample of the batch (of the step's forward calls in order, when a step runs several).

The fingerprint of a sample (one row of the model's first tensor argument along dim 0) is
BLAKE2b with an 8-byte digest of ``"<dtype>:<shape>:"`` (the row's dtype name without
``torch.``, its shape joined by ``x``: ``"int64:64:"``) followed by the row's bytes in C order.
A row of more than :data:`ROW_BYTES_CAP` bytes is hashed from an evenly strided sample of its
elements (every ``ceil(n / (cap // itemsize))``-th, each element's bytes whole) instead: the
hash runs on every recorded step, and a batch of images would otherwise cost a host copy and a
hash of every pixel per step. Two rows that differ only outside the sample get the same
fingerprint. The digest's 8 bytes are read as a little-endian *signed* 64-bit integer: smdebug
1.0.34's reader has no uint64 (``value.view(numpy.uint64)`` gives the unsigned reading).
``mltrace.pytorch.fingerprint(batch)`` computes the same values, to find a saved batch in a data
pipeline.
"""

from __future__ import annotations

import re

#: The collection of the per-sample tensors (``include_collections=["samples"]``; the
#: ``stability`` switch saves it too).
SAMPLES = "samples"
#: The first path part of its tensors' names.
PREFIX = "samples/"
#: Rows (samples) of the model's input above this many bytes are fingerprinted from a strided
#: sample of their elements (see the module docstring).
ROW_BYTES_CAP = 64 * 1024
#: The most samples a loss is computed for one at a time, when torch.func.vmap cannot batch it.
LOOP_LIMIT = 256
#: How close the mean of the per-sample losses must be to the loss module's own output
#: (relative): further apart, the loss is not a plain mean over the samples.
MEAN_RTOL = 1e-4


def loss_name(loss: str) -> str:
    """The per-sample losses' tensor name of the loss module named ``loss``."""
    return f"{PREFIX}{loss}/loss"


def fingerprint_name(model: str) -> str:
    """The fingerprints' tensor name of the model named ``model``."""
    return f"{PREFIX}{model}/fingerprint"


def collection_regex() -> str:
    """The include regex of the ``samples`` collection."""
    return "^" + re.escape(PREFIX)


__all__ = ["LOOP_LIMIT", "MEAN_RTOL", "PREFIX", "ROW_BYTES_CAP", "SAMPLES", "collection_regex",
           "fingerprint_name", "loss_name"]
