"""The transformer-stability signals: their collections, how their tensors are named, and the
one switch (the ``stability`` collection) that saves all of them.

Every signal is an ordinary tensor of a trial (a scalar, or one value per attention head),
named ``<collection prefix>/<subject>/<quantity>``:

=========================================  ===========================================  =================
tensor                                     what it holds                                shape
=========================================  ===========================================  =================
``attention/<module>/max_logit``           the largest pre-softmax logit (QK^T scaled,  one per head
                                           mask applied) of the step's calls
``attention/<module>/entropy``             the mean entropy of the attention            one per head
                                           distributions, in nats
``logits/<model>/log_z_mean``              mean over positions of log Z = logsumexp    scalar
``logits/<model>/log_z_max``               its maximum                                  scalar
``logits/<model>/max``                     the largest output logit                     scalar
``logits/<model>/entropy``                 mean entropy of the output distribution      scalar
``activations/<module>/abs_max``           max |a| of the module's first output         scalar
``activations/<module>/abs_median``        median |a| (estimated, see below)            scalar
``activations/<module>/max_over_median``   abs_max / abs_median                         scalar
``activations/<module>/l2``                L2 norm of the output (``nn.Linear`` only)    scalar
``grad_norm/<model>``                      L2 norm of all the model's gradients         scalar
``grad_norm/<model>_<param>``              L2 norm of one parameter's gradient          scalar
``updates/<model>_<param>/l2``             L2 norm of the update the optimizer applied  scalar
``updates/<model>_<param>/abs_max``        max |update|                                 scalar
``updates/<model>_<param>/ratio``          ||update|| / ||weight before the update||    scalar
``optimizer_state/<model>_<param>/...``    Adam's state after the step: ``exp_avg_rms``, scalar each
                                           ``exp_avg_abs_max``, ``exp_avg_sq_mean``,
                                           ``exp_avg_sq_max``, ``eps_fraction`` (share
                                           of elements with v > 0 whose sqrt(v_hat) is
                                           within 10x of epsilon), ``grad_sq_ratio``
                                           (mean g^2 / mean v_hat)
=========================================  ===========================================  =================

``<module>`` is the module's name in the model (``blocks.0.attn``), ``<model>`` the registered
model's root name (its class, as for weights: ``GPT``), ``<param>`` the parameter's name
(``blocks.0.attn.c_attn.weight``), so ``grad_norm/GPT_blocks.0.attn.c_attn.weight`` sits beside
the gradient ``gradient/GPT_blocks.0.attn.c_attn.weight``.

The ``samples`` collection (each sample's loss and a fingerprint of each sample's input:
mltrace.stability.samples), which says which batch and which samples a spike came from, is
saved when named beside the switch (``include_collections=["stability", "samples"]``): its
per-sample losses cost a recompute of the loss every saved step.

This module is framework-neutral: the PyTorch hook computes the signals
(mltrace.pytorch.stability), the rules read them (mltrace.rules.builtin.stability).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mltrace.stability.samples import PREFIX as SAMPLES_PREFIX
from mltrace.stability.samples import SAMPLES
from mltrace.stability.samples import collection_regex as samples_regex

#: The collection that saves every signal below and the losses (the one switch:
#: ``include_collections=["stability"]``, in JSON ``{"CollectionName": "stability"}``).
STABILITY = "stability"

ATTENTION = "attention"
LOGITS = "logits"
ACTIVATIONS = "activation_outliers"
GRAD_NORMS = "grad_norms"
UPDATES = "updates"
OPTIMIZER_STATE = "optimizer_state"

#: Each signal collection's tensor-name prefix (the first path part of its tensors' names).
PREFIXES: dict[str, str] = {
    ATTENTION: "attention/",
    LOGITS: "logits/",
    ACTIVATIONS: "activations/",
    GRAD_NORMS: "grad_norm/",
    UPDATES: "updates/",
    OPTIMIZER_STATE: "optimizer_state/",
}
SIGNAL_COLLECTIONS = tuple(PREFIXES)
#: Every collection of the set: the switch, its signals and the samples.
COLLECTIONS = (STABILITY, *SIGNAL_COLLECTIONS, SAMPLES)

#: The quantities each collection records per subject (scalars unless said).
QUANTITIES: dict[str, tuple[str, ...]] = {
    ATTENTION: ("max_logit", "entropy"),
    LOGITS: ("log_z_mean", "log_z_max", "max", "entropy"),
    ACTIVATIONS: ("abs_max", "abs_median", "max_over_median", "l2"),
    GRAD_NORMS: (),
    UPDATES: ("l2", "abs_max", "ratio"),
    OPTIMIZER_STATE: ("exp_avg_rms", "exp_avg_abs_max", "exp_avg_sq_mean", "exp_avg_sq_max",
                      "eps_fraction", "grad_sq_ratio"),
}

#: How many elements of a module's output the median |a| is estimated on (evenly strided): a
#: full median is a sort of the whole activation; 4,096 samples put the estimate within a few
#: percent of it for any tensor that is not adversarially ordered.
MEDIAN_SAMPLE = 4096
#: ``eps_fraction`` counts elements whose sqrt(v_hat) < EPS_DOMINANCE_FACTOR * epsilon.
EPS_DOMINANCE_FACTOR = 10.0


def collection_regex(collection: str) -> str:
    """The include regex of a signal collection (its prefix at the start of a name)."""
    return "^" + re.escape(PREFIXES[collection])


def collection_regexes(loss_regex: str) -> dict[str, list[str]]:
    """Every collection of the set, {name: include regexes}: one per signal collection, the
    samples', and ``stability`` for the signals with the losses (``loss_regex``: the
    framework's; not the samples, whose per-sample loss costs a recompute of the loss a step)."""
    regexes = {c: [collection_regex(c)] for c in SIGNAL_COLLECTIONS}
    regexes[SAMPLES] = [samples_regex()]
    regexes[STABILITY] = [collection_regex(c) for c in SIGNAL_COLLECTIONS] + [loss_regex]
    return regexes


def without_signals(regex: str) -> str:
    """smdebug's parameter regexes (``^(?!gradient).*weight``) with the signal and samples
    prefixes excluded as ``gradient`` is: ``grad_norm/GPT_fc.weight`` is no weight. Other
    regexes are returned as they are."""
    head = "^(?!gradient)"
    if not regex.startswith(head):
        return regex
    others = "|".join(re.escape(p) for p in (*PREFIXES.values(), SAMPLES_PREFIX))
    return f"^(?!gradient|{others})" + regex[len(head):]


def signal_name(collection: str, subject: str, quantity: str | None = None) -> str:
    """The tensor name of ``quantity`` of ``subject`` in a signal collection
    (``signal_name("attention", "blocks.0.attn", "max_logit")``); grad norms have no quantity."""
    name = PREFIXES[collection] + subject
    return name if quantity is None else f"{name}/{quantity}"


@dataclass(frozen=True)
class Signal:
    """A signal tensor's name taken apart."""

    collection: str
    subject: str
    quantity: str | None


def parse_signal(name: str) -> Signal | None:
    """The collection, subject and quantity of a signal tensor's name; None for other tensors.
    The subject may hold ``/`` (a module named so); the quantity is the last part when it is one
    of the collection's quantities."""
    for collection, prefix in PREFIXES.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        subject, _, quantity = rest.rpartition("/")
        if subject and quantity in QUANTITIES[collection]:
            return Signal(collection, subject, quantity)
        return Signal(collection, rest, None)
    return None


def layer_of(subject: str) -> str | None:
    """The layer a module or parameter name belongs to: the first ``<word>.<number>`` of it
    (``blocks.3`` of ``GPT_blocks.3.attn.c_attn.weight``, ``h.11`` of ``transformer.h.11.mlp``;
    ``2`` of ``Sequential_2.weight``), or None when the name has no numbered part."""
    match = re.search(r"(?:^|[._])([A-Za-z][A-Za-z0-9]*\.\d+)(?=\.|$)", subject)
    if match:
        return match.group(1)
    match = re.search(r"(?:^|[._])(\d+)(?=\.)", subject)  # a Sequential's numbered children
    return match.group(1) if match else None


__all__ = [
    "ACTIVATIONS", "ATTENTION", "COLLECTIONS", "EPS_DOMINANCE_FACTOR", "GRAD_NORMS", "LOGITS", "MEDIAN_SAMPLE",
    "OPTIMIZER_STATE", "PREFIXES", "QUANTITIES", "SIGNAL_COLLECTIONS", "STABILITY", "Signal", "UPDATES",
    "collection_regex", "collection_regexes", "layer_of", "parse_signal", "signal_name", "without_signals",
]
