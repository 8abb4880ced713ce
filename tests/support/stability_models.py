"""Small models for the stability-signal tests: a nanoGPT-style transformer whose attention is
torch's fused function or a softmax it materialises ("eager"), and a plain MLP (no attention)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

WIDTH, HEADS, CONTEXT, VOCABULARY = 16, 2, 8, 11


class Attention(nn.Module):
    """Causal self-attention, one Linear for Q, K and V."""

    def __init__(self, eager: bool) -> None:
        super().__init__()
        self.eager = eager
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K and V of ``x`` as (batch, heads, time, width / heads)."""
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        return tuple(z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.heads(x)
        if self.eager:
            scores = (q @ k.transpose(-2, -1)) / (c // HEADS) ** 0.5
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            y = F.softmax(scores, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, eager: bool) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(WIDTH)
        self.attn = Attention(eager)
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln(x))
        return x + self.fc(F.gelu(x))


class TinyGPT(nn.Module):
    """Two blocks; ``forward(tokens)`` returns the logits (batch, time, vocabulary)."""

    def __init__(self, eager: bool = False) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCABULARY, WIDTH)
        self.blocks = nn.ModuleList([Block(eager), Block(eager)])
        self.head = nn.Linear(WIDTH, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batches(steps: int, batch: int = 3, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens, next tokens) of a seeded random stream."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.randint(0, VOCABULARY, (batch, CONTEXT + 1), generator=gen)
        out.append((x[:, :-1], x[:, 1:]))
    return out


class TokenLoss(nn.Module):
    """Cross-entropy over every position, as a module the hook can register."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
