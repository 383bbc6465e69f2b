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
  summaries) is built by :func:`cache_state`, before the measured region, and counted in
  ``kv_cache_bytes`` with K and V.
- ``budget`` (tokens; 0: the entries' own options): each selection method's budget
  option set to attend that many keys per query besides its own page or block
  (:func:`topk_bench.workloads.attention.with_budget`), so one sweep moves top-k's k,
  page top-k's token budget, the window and the number of blocks together.

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

from topk_bench.attention import spec
from topk_bench.types import Mode
from topk_bench.workloads.attention import (
    BUDGET,
    AttentionLayer,
    attention_flops,
    element_size,
    grouped,
    heads_group,
    keys_or_values,
    queries,
)
from topk_bench.workloads.models import CUSTOM, MODELS
from topk_bench.workloads.spec import Fixed, Traffic, Workload, WorkloadSpec, register


class DecodeStep(nn.Module):
    """Write the new tokens' K/V into the cache's room for them, then attend over the whole cache."""

    def __init__(self, layer: AttentionLayer, state: dict[str, Any] | None = None, case=None):
        super().__init__()
        self.layer, self.case = layer, case
        # What the implementation keeps with the cache (its call's options too): buffers, so that the
        # harness counts them with the cache in baseline_bytes.
        for name, value in (state or {}).items():
            if isinstance(value, torch.Tensor):
                self.register_buffer(f"cache_{name}", value, persistent=False)

    def refresh_state(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Rebuild what the implementation keeps with the cache after the cache's contents were replaced, in place."""
        for name, value in cache_state(self.case, k_cache, v_cache).items():
            getattr(self, f"cache_{name}").copy_(value)

    def forward(self, q, k_new, v_new, k_cache, v_cache):
        n = q.shape[-2]
        k_cache[..., -n:, :].copy_(k_new)
        v_cache[..., -n:, :].copy_(v_new)
        return self.layer(q, k_cache, v_cache)


def cache_state(case, k_cache: torch.Tensor, v_cache: torch.Tensor) -> dict[str, Any]:
    """What the case's implementation keeps with its cache besides K and V, as options of its call.

    The registry entry's ``cache_state`` (page_topk: its page summaries, option ``summaries``; block_topk: its
    block means, option ``means``; nsa: its compressed keys and values), built here with the cache, before the
    measured region, as a serving system keeps it with its cache: a step does not rebuild it, and its bytes are
    counted with the cache (``baseline_bytes`` and ``kv_cache_bytes``). Built over the whole buffer after the new
    tokens' K/V are in it (the step writes the same values again); keeping the current page's summary up to date
    as tokens arrive is a serving system's cost outside a step, left out.
    """
    impl = spec(case.impl)
    return {} if impl.cache_state is None else impl.cache_state(k_cache, v_cache, impl.resolve(case.option_dict))


def cache_state_bytes(case) -> int:
    """Bytes of :func:`cache_state` for the case's cache, from its shapes alone (built on the meta device)."""
    p = DECODE.shape(case)
    k = torch.empty(  # V as K: the meta device needs only their shapes
        p["batch"],
        p["kv_heads"],
        p["kv_len"] + p["new_tokens"],
        p["head_dim"],
        dtype=getattr(torch, case.dtype),
        device="meta",
    )
    return sum(x.nbytes for x in cache_state(case, k, k).values() if isinstance(x, torch.Tensor))


def attention_inputs(workload: Workload) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` of the step's attention: the queries and the whole cache, the new tokens' K/V in it."""
    return _filled(workload.inputs)


def _filled(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`attention_inputs` of a step's inputs ``(q, k_new, v_new, k_cache, v_cache)``."""
    q, k_new, v_new, k_cache, v_cache = inputs
    n = q.shape[-2]
    with torch.no_grad():
        k_cache[..., -n:, :].copy_(k_new)
        v_cache[..., -n:, :].copy_(v_new)
    return q, k_cache, v_cache


def build(case, device, dtype) -> Workload:
    p = DECODE.shape(case)
    b, n, cached, d = p["batch"], p["new_tokens"], p["kv_len"], p["head_dim"]
    # Inputs first: the same case always gets the same inputs, whatever the implementation draws.
    q = queries(b, p["q_heads"], n, d)
    k_new, v_new = (keys_or_values(b, p["kv_heads"], n, d) for _ in range(2))
    # The whole buffer is drawn; the step overwrites its last n positions with k_new / v_new.
    k_cache, v_cache = (keys_or_values(b, p["kv_heads"], cached + n, d) for _ in range(2))
    inputs = (q, k_new, v_new, k_cache, v_cache)
    _filled(inputs)  # the new tokens' K/V in the cache, as after every step, before its state is built
    state = cache_state(case, k_cache, v_cache)
    layer = AttentionLayer(case.impl, d, causal=True, activation=case.activation, **case.option_dict, **state)
    return Workload(DecodeStep(layer, state, case), inputs)


def traffic(case) -> Traffic:
    p = DECODE.shape(case)
    b, n, cached, hq, hkv, d = p["batch"], p["new_tokens"], p["kv_len"], p["q_heads"], p["kv_heads"], p["head_dim"]
    per_position = element_size(case.dtype) * b * d  # bytes of one head at one position, all sequences
    # Q read, O written; new K/V read and written into the cache; the cache (with them) read once.
    moved = per_position * (2 * hq * n + 4 * hkv * n + 2 * hkv * (cached + n))
    return Traffic(
        flops=attention_flops(b, hq, n, cached + n, d, causal=True, mode=Mode.FWD),
        bytes=moved,
        tokens=b * n,
        tokens_per_sequence=n,
        kv_cache_bytes=2 * hkv * cached * per_position + cache_state_bytes(case),
    )


DECODE = register(
    WorkloadSpec(
        name="decode",
        description="one decode step: new tokens' K/V written into a preallocated KV cache, then attention over it",
        build=build,
        # model "custom": the head counts below (Llama-3-8B's attention); a named model sets them.
        params={
            "model": CUSTOM,
            "kv_len": 4096,
            "new_tokens": 1,
            "batch": 1,
            "q_heads": 32,
            "kv_heads": 8,
            "head_dim": 128,
            BUDGET: 0,
        },
        optional_params=(BUDGET,),
        presets={"model": MODELS},
        causal=True,
        fixed={
            "causal": Fixed(True, "a decode step attends causally: expected causal = true"),
            "mode": Fixed(Mode.FWD, "a decode step is forward only: expected mode = 'fwd'"),
        },
        mode=Mode.FWD,
        check_params=heads_group,
        grouped_heads=grouped,
        traffic=traffic,
        attention_inputs=attention_inputs,
    )
)
