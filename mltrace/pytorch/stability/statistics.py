"""The stability signals as torch computations, on the tensor's device, never synchronising with
the host: attention logits and entropies, output-logit statistics, module-output outliers
(mltrace.stability.signals names what each returns). Plain functions of tensors, so the tests
check each one against a direct computation of the same quantity."""

from __future__ import annotations

import math

import torch

from mltrace.stability.signals import MEDIAN_SAMPLE

#: Attention scores are computed this many elements at a time at most (query rows in chunks),
#: so a long context's score matrix is never materialised whole.
SCORE_CHUNK_ELEMENTS = 1 << 24


def _work(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, in float32 (float64 stays float64): halves overflow in exp and sums."""
    t = t.detach()
    return t if t.dtype == torch.float64 else t.float()


def sdpa_statistics(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    is_causal: bool = False, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the largest pre-softmax logit and the mean attention entropy (nats) of one
    ``scaled_dot_product_attention(query, key, ...)`` call, with its arguments' meaning: logits
    ``q k^T * scale`` (scale default 1/sqrt(E)), ``attn_mask`` boolean (False: masked) or added,
    ``is_causal`` masking as torch does (top-left aligned). Key heads fewer than query heads
    (grouped-query attention) are repeated. Masked entries count in neither statistic; a query
    row with every key masked has no entropy."""
    q, k = _work(query), _work(key)
    if q.dim() < 3:  # (L, E): one head, no batch
        q, k = q.unsqueeze(0), k.unsqueeze(0)
    if q.dim() == 3:  # (N, L, E): torch's unbatched-heads form, one head
        q, k = q.unsqueeze(-3), k.unsqueeze(-3)
    heads, rows, keys = q.shape[-3], q.shape[-2], k.shape[-2]
    if k.shape[-3] != heads and heads % k.shape[-3] == 0:
        k = k.repeat_interleave(heads // k.shape[-3], dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = _as_bias(attn_mask, q.dtype) if attn_mask is not None else None
    per_row = max(1, q[..., :1, :].numel() // q.shape[-1] * keys)  # scores of one query row
    chunk = max(1, SCORE_CHUNK_ELEMENTS // per_row)
    best = torch.full((heads,), -math.inf, dtype=q.dtype, device=q.device)
    entropy_sum = torch.zeros(heads, dtype=q.dtype, device=q.device)
    counted = torch.zeros(heads, dtype=q.dtype, device=q.device)
    kt = k.transpose(-2, -1)
    for start in range(0, rows, chunk):
        scores = (q[..., start:start + chunk, :] @ kt) * scale
        if is_causal:
            taken = torch.ones(scores.shape[-2], keys, dtype=torch.bool, device=q.device)
            scores = scores.masked_fill(~taken.tril(start), -math.inf)
        if mask is not None:
            scores = scores + (mask[..., start:start + chunk, :] if mask.shape[-2] == rows else mask)
        best = torch.maximum(best, _per_head(scores.amax(dim=(-2, -1)), torch.amax))
        entropy, live = _row_entropy(scores)
        entropy_sum += _per_head(entropy.sum(-1), torch.sum)
        counted += _per_head(live.sum(-1).to(q.dtype), torch.sum)
    return best, entropy_sum / counted


def softmax_statistics(scores: torch.Tensor, probabilities: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the largest logit and the mean entropy of an attention softmax that a model
    materialises itself ("eager" attention): ``scores`` the softmax's input of shape
    (batch, heads, queries, keys), masked entries already -inf or the dtype's lowest value,
    ``probabilities`` its output."""
    p = _work(probabilities)
    best = _work(scores).amax(dim=(0, 2, 3))
    entropy = -torch.special.xlogy(p, p).sum(-1)
    return best, entropy.mean(dim=(0, 2))


def _as_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)
    return mask.detach().to(dtype)


def _row_entropy(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query row's attention entropy (0 where the row is fully masked) and whether the row
    has any key at all."""
    live = torch.isfinite(scores.amax(-1))
    p = torch.softmax(scores, dim=-1)
    entropy = -torch.special.xlogy(p, p).sum(-1)
    return torch.where(live, entropy, torch.zeros_like(entropy)), live


def _per_head(values: torch.Tensor, op: object) -> torch.Tensor:
    """Reduce (..., heads) to (heads,) with ``op`` (torch.amax or torch.sum) over the batch dims."""
    if values.dim() == 1:
        return values
    return op(values.reshape(-1, values.shape[-1]), dim=0)  # type: ignore[operator]


def logits_statistics(logits: torch.Tensor) -> torch.Tensor:
    """[mean log Z, max log Z, max logit, mean entropy] of output logits (..., vocabulary):
    log Z = logsumexp over the vocabulary at each position, the entropy that of the softmax."""
    x = _work(logits).reshape(-1, logits.shape[-1])
    log_z = torch.logsumexp(x, dim=-1)
    p = torch.exp(x - log_z.unsqueeze(-1))
    expected = torch.where(p > 0, p * x, torch.zeros_like(x)).sum(-1)
    return torch.stack([log_z.mean(), log_z.max(), x.max(), (log_z - expected).mean()])


def outlier_statistics(output: torch.Tensor, with_l2: bool) -> torch.Tensor:
    """[max |a|, median |a|, max/median (, L2)] of a module's output: the median is the lower
    median of at most MEDIAN_SAMPLE evenly strided elements (a full median sorts the whole
    activation; the sample keeps it to one small kernel)."""
    a = _work(output).reshape(-1).abs()
    stride = max(1, a.numel() // MEDIAN_SAMPLE)
    top, median = a.max(), a[::stride][:MEDIAN_SAMPLE].median()
    parts = [top, median, top / median]
    if with_l2:
        parts.append(torch.linalg.vector_norm(a))
    return torch.stack(parts)


__all__ = ["SCORE_CHUNK_ELEMENTS", "logits_statistics", "outlier_statistics", "sdpa_statistics",
           "softmax_statistics"]
