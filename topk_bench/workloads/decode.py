"""``decode``: one decode step of a causal attention layer: ``new_tokens`` queries over a KV cache of ``kv_len`` tokens.

Heads as in ``prefill`` (``q_heads``, ``kv_heads``, ``head_dim`` or a ``model``).
Forward only: a decode step has no backward.

The cache model:

- The cache is an input, built before the measured region: K and V
  ``[B, kv_heads, kv_len + new_tokens, head_dim]`` (heads before positions, the
  implementations' layout), the first ``kv_len`` positions filled (the cached tokens),
  the last ``new_tokens`` positions room for the step's own K/V. ``kv_cache_bytes``
  counts the ``kv_len`` cached tokens: ``2 x batch x kv_heads x kv_len x head_dim x``
  the element size; the new tokens' K/V are part of the step. The preallocated room is
  in ``baseline_bytes`` with the cache; the step's working memory is
  ``peak_bytes - baseline_bytes``.
- One step, the measured region: write the new tokens' K/V (inputs ``k_new``,
  ``v_new``) into their room in place (no copy of the cache), then attend the
  ``new_tokens`` queries to all ``kv_len + new_tokens`` positions, causally (bottom-right:
  new token ``i`` sees the cache and new tokens ``0..i``). Every step writes the same
  values, so every iteration starts from the same cache.
- What an implementation keeps with its cache besides K and V (page top-k's page
  summaries) is built by :func:`cache_state`, before the measured region.

Cost model (docs/CONTRACTS.md): dense attention's FLOPs over the attended pairs; bytes:
Q read and O written once, the new K/V read once and written into the cache once, the
cache (``kv_len + new_tokens`` positions of K and V) read once. ``tokens_per_s`` counts
``batch x new_tokens`` tokens per step; ``time_per_token_s`` is a step's time per new token
of one sequence.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from topk_bench.workloads.attention import (
    AttentionLayer, attention_flops, element_size, grouped, heads_group, keys_or_values, queries,
)
from topk_bench.workloads.models import CUSTOM, MODELS
from topk_bench.workloads.spec import Fixed, Traffic, Workload, WorkloadSpec, register


class DecodeStep(nn.Module):
    """Write the new tokens' K/V into the cache's room for them, then attend over the whole cache."""

    def __init__(self, layer: AttentionLayer):
        super().__init__()
        self.layer = layer

    def forward(self, q, k_new, v_new, k_cache, v_cache):
        n = q.shape[-2]
        k_cache[..., -n:, :].copy_(k_new)
        v_cache[..., -n:, :].copy_(v_new)
        return self.layer(q, k_cache, v_cache)


def cache_state(case, k_cache: torch.Tensor, v_cache: torch.Tensor) -> dict[str, Any]:
    """What the case's implementation keeps with its cache besides K and V, as options of its call.

    The hook for per-cache state (issue 16: page_topk's page summaries, its
    ``summaries`` option): built here, with the cache, before the measured region, so
    that a step does not rebuild it and its bytes are counted with the cache
    (``baseline_bytes``; ``kv_cache_bytes`` counts K and V only, see :func:`traffic`).
    Empty for now: an implementation with such state builds it in every step.
    """
    return {}


def build(case, device, dtype) -> Workload:
    p = DECODE.shape(case)
    b, n, cached, d = p["batch"], p["new_tokens"], p["kv_len"], p["head_dim"]
    # Inputs first: the same case always gets the same inputs, whatever the implementation draws.
    q = queries(b, p["q_heads"], n, d)
    k_new, v_new = (keys_or_values(b, p["kv_heads"], n, d) for _ in range(2))
    # The whole buffer is drawn; the step overwrites its last n positions with k_new / v_new.
    k_cache, v_cache = (keys_or_values(b, p["kv_heads"], cached + n, d) for _ in range(2))
    options = {**case.option_dict, **cache_state(case, k_cache, v_cache)}
    model = DecodeStep(AttentionLayer(case.impl, d, causal=True, activation=case.activation, **options))
    return Workload(model, (q, k_new, v_new, k_cache, v_cache))


def traffic(case) -> Traffic:
    p = DECODE.shape(case)
    b, n, cached, hq, hkv, d = p["batch"], p["new_tokens"], p["kv_len"], p["q_heads"], p["kv_heads"], p["head_dim"]
    per_position = element_size(case.dtype) * b * d  # bytes of one head at one position, all sequences
    # Q read, O written; new K/V read and written into the cache; the cache (with them) read once.
    moved = per_position * (2 * hq * n + 4 * hkv * n + 2 * hkv * (cached + n))
    return Traffic(
        flops=attention_flops(b, hq, n, cached + n, d, causal=True, mode="fwd"),
        bytes=moved, tokens=b * n, tokens_per_sequence=n,
        kv_cache_bytes=2 * hkv * cached * per_position,
    )


DECODE = register(WorkloadSpec(
    name="decode",
    description="one decode step: new tokens' K/V written into a preallocated KV cache, then attention over it",
    build=build,
    # model "custom": the head counts below (Llama-3-8B's attention); a named model sets them.
    params={"model": CUSTOM, "kv_len": 4096, "new_tokens": 1, "batch": 1, "q_heads": 32, "kv_heads": 8,
            "head_dim": 128},
    presets={"model": MODELS},
    causal=True,
    fixed={
        "causal": Fixed(True, "a decode step attends causally: expected causal = true"),
        "mode": Fixed("fwd", "a decode step is forward only: expected mode = 'fwd'"),
    },
    mode="fwd",
    check_params=heads_group,
    grouped_heads=grouped,
    traffic=traffic,
))
