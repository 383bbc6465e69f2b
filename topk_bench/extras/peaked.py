"""Synthetic queries, keys and values whose attention is peaked as an LLM head's is: attention sinks, locality and
heavy hitters, from a seed (the ``quality = ["peaked"]`` input).

Random Gaussian q, k give flat attention: every key scores about the same, so a selection method keeps about
its share of the mass whatever it selects, and random quality tells methods apart by nothing. Trained heads
are peaked in three ways the sparse methods are built around:

* **sinks** (StreamingLLM, Xiao et al. 2024): the first few tokens draw a large share of every query's mass;
* **locality**: the nearest tokens score highest, decaying with distance (the sliding windows of NSA and
  StreamingLLM, the own block of MoBA and NSA);
* **heavy hitters** (H2O, Zhang et al. 2023): a few scattered tokens draw mass from every query (what top-k,
  Quest and NSA's selection must find).

The logit of query ``i`` (at position ``p``) on key ``j`` is, per K/V head (its ``G`` query heads share the
structure, each with its own content noise and strength):

    q·k = content (N(0, 1))
        + A / F · Σ_f cos(ω_f (p - j))    (locality: A at distance 0, about A · (frequencies with ω_f·Δ < 1) / F
                                           at distance Δ, a decay logarithmic in the distance)
        + S · [j < sinks]                  (sinks)
        + H · [j is a heavy hitter]        (a random ``heavy_fraction`` of the keys)

with ``F = FREQUENCIES`` frequencies ``ω_f`` geometric from 1 down to ``π / Lk`` (no recurrence within the
keys). Each K/V head draws its strengths ``A, S, H`` uniformly from :data:`LOCAL`, :data:`SINK`,
:data:`HEAVY` (heads differ: some local, some sink- or retrieval-dominated, as measured heads do) and each
query head scales them by a factor in ``[0.5, 1.5]``. Values are N(0, 1). ``q`` is returned already scaled
(the logits above are ``q · k``, as the implementations take ``q``).

The three structures take ``2F + 2`` of the head dimensions; the rest carry content: ``head_dim`` must be at
least ``2F + 4``. Drawn in float32 on the CPU with ``torch.Generator(seed)``: the same seed gives the same
tensors on any machine. No harness import: usable alone.
"""

from __future__ import annotations

import math

import torch

FREQUENCIES = 8
SINKS = 4
HEAVY_FRACTION = 0.002
# Per-K/V-head strength ranges (logits): locality peak A, sink S, heavy hitter H.
LOCAL = (4.0, 12.0)
SINK = (8.0, 14.0)
HEAVY = (4.0, 8.0)


def min_head_dim() -> int:
    return 2 * FREQUENCIES + 4


def peaked_qkv(
    batch: int,
    q_heads: int,
    kv_heads: int,
    q_len: int,
    k_len: int,
    head_dim: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    value_dim: int | None = None,
    sinks: int = SINKS,
    heavy_fraction: float = HEAVY_FRACTION,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q [B, Hq, Lq, d]`` (scaled), ``k [B, Hkv, Lk, d]``, ``v [B, Hkv, Lk, dv]`` with peaked attention.

    Query ``i`` sits at position ``Lk - Lq + i`` (bottom-right, as a KV cache).
    """
    f = FREQUENCIES
    if head_dim < min_head_dim():
        raise ValueError(f"peaked inputs need head_dim >= {min_head_dim()} (2 x {f} positional + 4), got {head_dim}")
    if q_heads % kv_heads:
        raise ValueError(f"kv_heads ({kv_heads}) must divide q_heads ({q_heads})")
    gen = torch.Generator().manual_seed(seed)
    g = q_heads // kv_heads
    content = head_dim - 2 * f - 2
    dv = head_dim if value_dim is None else value_dim

    def uniform(shape, lo_hi):
        lo, hi = lo_hi
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    # Per K/V head strengths, per query head factors.
    a, s, h = (uniform((batch, kv_heads, 1, 1), r) for r in (LOCAL, SINK, HEAVY))
    scale = uniform((batch, kv_heads, g, 1, 1), (0.5, 1.5))
    omega = torch.logspace(0.0, math.log10(math.pi / max(k_len, 2)), f)  # [F], 1 .. π/Lk
    k_pos = torch.arange(k_len, dtype=torch.float32)
    q_pos = torch.arange(k_len - q_len, k_len, dtype=torch.float32)

    def rotary(pos):  # [L, 2F]: cos and sin of ω_f · pos
        angles = pos.unsqueeze(1) * omega
        return torch.cat((angles.cos(), angles.sin()), dim=1)

    # Keys: [content | positional (2F) | sink | heavy]
    k = torch.empty(batch, kv_heads, k_len, head_dim)
    k[..., :content] = torch.randn(batch, kv_heads, k_len, content, generator=gen)
    k[..., content : content + 2 * f] = rotary(k_pos) * (a / f).sqrt()
    k[..., -2] = (k_pos < sinks).float() * s.squeeze(-1)
    heavy = torch.rand(batch, kv_heads, k_len, generator=gen) < heavy_fraction
    k[..., -1] = heavy.float() * h.squeeze(-1)
    # Queries: content / sqrt(content) gives N(0, 1) content logits; the structures' unit (or sqrt(A / F)) parts.
    q = torch.empty(batch, kv_heads, g, q_len, head_dim)
    q[..., :content] = torch.randn(batch, kv_heads, g, q_len, content, generator=gen) / math.sqrt(content)
    q[..., content : content + 2 * f] = rotary(q_pos) * (a.unsqueeze(2) / f).sqrt() * scale
    q[..., -2:] = scale.expand(batch, kv_heads, g, q_len, 1)
    v = torch.randn(batch, kv_heads, k_len, dv, generator=gen)
    q = q.reshape(batch, q_heads, q_len, head_dim)
    return q.to(dtype), k.to(dtype), v.to(dtype)
