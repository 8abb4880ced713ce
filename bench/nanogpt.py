"""A nanoGPT-style transformer in plain PyTorch: the benchmarks' yardstick for a transformer step.

Token and position embeddings, pre-LayerNorm blocks of causal self-attention (one fused QKV
projection, ``scaled_dot_product_attention``) and a GELU MLP, a final LayerNorm and an output
head tied to the token embedding, as in Karpathy's nanoGPT. The default size (4 blocks, width
128, 4 heads, context 64, vocabulary 96) has about 0.85M parameters in 50 tensors: big enough
that a step is a few hundred kernels, small enough that a benchmark of it runs on 2 CPU cores.

Data: a fixed random token stream, batches cut from it with a seeded generator (what a
char-level language model sees, without a data set to download).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    """The model's size. The defaults are the benchmarks' yardstick."""

    blocks: int = 4
    width: int = 128
    heads: int = 4
    context: int = 64
    vocabulary: int = 96
    batch: int = 8


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: one Linear for Q, K and V, torch's fused attention."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.c_attn = nn.Linear(config.width, 3 * config.width)
        self.c_proj = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.width, 4 * config.width)
        self.c_proj = nn.Linear(4 * config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.width)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The language model; ``forward(tokens)`` returns the logits (batch, context, vocabulary)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocabulary, config.width)
        self.wpe = nn.Embedding(config.context, config.width)
        self.h = nn.ModuleList(Block(config) for _ in range(config.blocks))
        self.ln_f = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocabulary, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.blocks))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class LanguageModelLoss(nn.modules.loss._Loss):
    """Cross-entropy of logits (batch, context, vocabulary) against next tokens (batch, context):
    a loss module, so that hooks can register it as the loss (smdebug asks for a ``_Loss``)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_model(config: GPTConfig = GPTConfig(), seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def make_optimizer(model: nn.Module, lr: float = 3e-4) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)


def make_batches(steps: int, config: GPTConfig = GPTConfig(), seed: int = 0
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (input, target) batches cut at random places from one fixed token stream."""
    gen = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, config.vocabulary, (20_000,), generator=gen)
    batches = []
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - config.context - 1, (config.batch,), generator=gen)
        x = torch.stack([stream[s:s + config.context] for s in starts.tolist()])
        y = torch.stack([stream[s + 1:s + 1 + config.context] for s in starts.tolist()])
        batches.append((x, y))
    return batches
