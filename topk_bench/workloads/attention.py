"""What the prefill and decode workloads share: one attention call without projections, its inputs, the
grouped-head rule and the cost model (FLOPs, bytes) of docs/CONTRACTS.md.

The layer takes ``q [B, Hq, Lq, d]`` (already scaled by ``1/sqrt(d)``, as the
implementations expect) and ``k, v [B, Hkv, Lk, d]``, heads before positions, and
returns ``[B, Hq, Lq, d]``: the unit FlashAttention's and FlashInfer's benchmarks
measure, and the one whose bytes a model can state exactly (no projection weights,
no activations of other layers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from topk_bench.attention import spec
from topk_bench.types import DType, Mode

# The backward of attention is 2.5 forwards (FlashAttention's and tritonbench's convention:
# dV, dP, dQ, dK and the recomputed scores), so forward + backward is 3.5 forwards.
BACKWARD_PER_FORWARD = 2.5


class AttentionLayer(nn.Module):
    """``attention(q, k, v)`` of one registry implementation with its options; no projections."""

    def __init__(self, impl: str, head_dim: int, *, causal: bool, activation: str, **options: Any):
        super().__init__()
        self.causal, self.activation = causal, activation
        self.attention = spec(impl).module(head_dim, **options)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attention(q, k, v, causal=self.causal, activation=self.activation)


# A workload parameter (decode): the selection methods' token budget, 0 = each entry's own options.
BUDGET = "budget"


def with_budget(impl: str, options: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    """``options`` of ``impl`` with its budget option(s) set to attend ``tokens`` keys per query (besides its own
    page or block): the registry entry's ``budget``. Unchanged for a method without one (dense attention) or
    for ``tokens`` 0."""
    resolved = spec(impl).resolve(options)
    rule = spec(impl).budget
    if not tokens or rule is None:
        return dict(options)
    return {**options, **rule(int(tokens), resolved)}


def queries(batch: int, heads: int, length: int, head_dim: int) -> torch.Tensor:
    """Random queries, scaled by ``1/sqrt(head_dim)`` when drawn (a leaf: no scaling op in the measured region)."""
    return torch.randn(batch, heads, length, head_dim).mul_(1.0 / math.sqrt(head_dim))


def keys_or_values(batch: int, heads: int, length: int, head_dim: int) -> torch.Tensor:
    return torch.randn(batch, heads, length, head_dim)


def grouped(params: Mapping[str, Any]) -> bool:
    """Fewer K/V heads than query heads: grouped-query (or multi-query) attention."""
    return params["kv_heads"] < params["q_heads"]


def heads_group(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """Each K/V head serves ``q_heads / kv_heads`` query heads: ``kv_heads`` must divide ``q_heads``."""
    if params["q_heads"] % params["kv_heads"]:
        return "kv_heads", (
            f"expected kv_heads ({params['kv_heads']}) to divide q_heads ({params['q_heads']}): "
            "each K/V head serves q_heads / kv_heads query heads"
        )
    return None


def attended_pairs(lq: int, lk: int, causal: bool) -> int:
    """(query, key) pairs one head attends: all of them, or bottom-right causal (query i sees keys
    ``j <= lk - lq + i``: rows before the first key see none)."""
    if not causal:
        return lq * lk
    m = min(lq, lk)  # the last m rows see lk - m + 1 ... lk keys
    return m * (lk - m) + m * (m + 1) // 2


def attention_flops(batch: int, q_heads: int, lq: int, lk: int, head_dim: int, *, causal: bool, mode: str) -> int:
    """FLOPs of dense attention over the attended pairs: ``Q Kᵀ`` and ``P V``, 2 each per pair and dimension."""
    forward = 4 * batch * q_heads * attended_pairs(lq, lk, causal) * head_dim
    return int(forward * (1 + BACKWARD_PER_FORWARD)) if Mode(mode).backward else forward


def projections_flops(batch: int, seq_len: int, d_model: int, *, mode: str, count: int = 4) -> int:
    """FLOPs of ``count`` d_model x d_model projections over every token: 2 per multiply-add; a backward is two
    forwards (the input's gradient and the weight's)."""
    forward = 2 * batch * seq_len * d_model * d_model * count
    return forward * 3 if Mode(mode).backward else forward


def element_size(dtype: str) -> int:
    """Bytes of one element of a case's dtype (``"bfloat16"``: 2)."""
    return DType(dtype).itemsize
