"""Hand-written tiny models for the model suite's CPU tests (no ``transformers`` or ``timm``).

``TinyLM`` is a pre-norm decoder: token embedding, ``layers`` blocks of causal
self-attention + GELU MLP, a final LayerNorm and an untied LM head.  Every
projection is a ``torch.nn.Linear`` (so ``tritongemm.nn.convert`` swaps them)
and attention's two products are ``@`` on 4-D tensors (so ``tritongemm.patch()``
routes them as batched GEMMs), which covers the three ways a real model reaches
a GEMM.  A few dozen hidden units keep it fast on Triton's interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 48
    hidden: int = 32
    heads: int = 2
    mlp: int = 64
    layers: int = 1


class TinyAttention(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        # softmax in fp32, as real models do for bf16 activations
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        return self.out((probs @ v).transpose(1, 2).reshape(b, s, h))


class TinyMLP(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.up = nn.Linear(cfg.hidden, cfg.mlp)
        self.down = nn.Linear(cfg.mlp, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class TinyBlock(nn.Module):
    """One transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden)
        self.attn = TinyAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.hidden)
        self.mlp = TinyMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token ids (B, S) -> logits (B, S, vocab)."""

    def __init__(self, cfg: TinyConfig = TinyConfig()):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(TinyBlock(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def greedy_full_recompute(
    model: nn.Module, prompt: torch.Tensor, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding without a KV cache: (new tokens (B, steps), their logits (steps, B, vocab) in fp32)."""
    ids = prompt
    tokens, scores = [], []
    for _ in range(steps):
        logits = model(ids)[:, -1, :].float()
        nxt = logits.argmax(dim=-1)
        tokens.append(nxt)
        scores.append(logits)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return torch.stack(tokens, dim=1), torch.stack(scores)


__all__ = ["TinyConfig", "TinyBlock", "TinyLM", "greedy_full_recompute"]
