"""The layers the paper benchmarks, each built around a registry implementation.

The layers project to as many K/V heads as query heads (no grouped-query variant here:
the implementations take ``k, v`` with fewer heads directly). Their causal attention
has ``Lq == Lk``, where bottom-right alignment is the usual ``j <= i``. Half precision:
cast a layer (``.to(torch.bfloat16)``); the implementations keep the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from topk_bench.attention.registry import spec


class MultiHeadAttention(nn.Module):
    """BERT-base self-attention sublayer: Q/K/V/O projections around an attention function."""

    def __init__(
        self,
        d_model: int = 768,
        heads: int = 12,
        attention: str = "vanilla",
        *,
        causal: bool = False,
        activation: str = "softmax",
        scale_in_attention: bool = False,
        **options: Any,
    ):
        """``scale_in_attention``: pass ``q`` unscaled and have the attention multiply its scores
        by ``head_dim ** -0.5`` (its ``scale`` option), as the authors' benchmark code did; only
        for implementations with a ``scale`` option. Default: ``q`` is scaled here."""
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
        self.heads = heads
        self.head_dim = d_model // heads
        self.causal = causal
        self.activation = activation
        self.scale_in_attention = scale_in_attention
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)
        if scale_in_attention:
            if "scale" not in spec(attention).options:
                raise ValueError(f"scale_in_attention needs an attention with a 'scale' option; {attention!r} has none")
            if "scale" in options:
                raise ValueError("scale_in_attention sets the attention's 'scale' itself: do not pass one")
            options = {**options, "scale": self.head_dim**-0.5}
        self.attention = spec(attention).module(self.head_dim, **options)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d_model = x.shape
        q = self.q_proj(x)
        if not self.scale_in_attention:
            q = q * (1.0 / math.sqrt(self.head_dim))
        q = self._split(q)
        k = self._split(self.k_proj(x))
        v = self._split(self.v_proj(x))
        out = self.attention(q, k, v, causal=self.causal, activation=self.activation)
        return self.o_proj(out.transpose(1, 2).reshape(b, length, d_model))


class FeedForward(nn.Module):
    """``relu(x W1ᵀ) W2`` computed as attention with keys ``W1`` and values ``W2ᵀ`` (paper Eq. 3).

    All ``batch x length`` tokens are queries of one head (the paper chunks 2^18 of them).
    """

    def __init__(self, d_model: int = 768, d_ff: int = 3072, attention: str = "vanilla", **options: Any):
        super().__init__()
        self.keys = nn.Parameter(torch.empty(d_ff, d_model))  # W1 [d_ff, d_model]
        self.values = nn.Parameter(torch.empty(d_ff, d_model))  # W2ᵀ [d_ff, d_model]
        nn.init.normal_(self.keys, std=1.0 / math.sqrt(d_model))
        nn.init.normal_(self.values, std=1.0 / math.sqrt(d_ff))
        self.attention = spec(attention).module(d_model, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        q = x.reshape(1, 1, -1, shape[-1])
        out = self.attention(q, self.keys[None, None], self.values[None, None], causal=False, activation="relu")
        return out.reshape(shape)


class DecoderBlock(nn.Module):
    """Post-LN Transformer block (as BERT): ``LN(x + MHA(x))``, then ``LN(h + FF(h))``."""

    def __init__(self, d_model, heads, d_ff, attention, feedforward, attention_options, feedforward_options):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, heads, attention, causal=True, **attention_options)
        self.ln1 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, feedforward, **feedforward_options)
        self.ln2 = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x + self.mha(x))
        return self.ln2(h + self.ff(h))


class Decoder(nn.Module):
    """N causal post-LN blocks on hidden states; attention and feed-forward implementations chosen independently."""

    def __init__(
        self,
        layers: int = 12,
        d_model: int = 768,
        heads: int = 12,
        d_ff: int = 3072,
        attention: str = "vanilla",
        feedforward: str = "vanilla",
        attention_options: Mapping[str, Any] | None = None,
        feedforward_options: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.blocks = nn.ModuleList(
            DecoderBlock(
                d_model,
                heads,
                d_ff,
                attention,
                feedforward,
                dict(attention_options or {}),
                dict(feedforward_options or {}),
            )
            for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x
