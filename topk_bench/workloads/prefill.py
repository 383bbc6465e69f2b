"""``prefill``: one causal attention layer over a prompt of ``seq_len`` tokens, forward only by default.

``q_heads`` query heads and ``kv_heads`` key/value heads of ``head_dim`` (grouped-query
attention: each K/V head serves ``q_heads / kv_heads`` query heads; multi-head when
equal, multi-query when 1), or a real model's shape with ``model`` (:mod:`.models`).
No projections: the inputs are ``q`` (scaled), ``k`` and ``v``
(:mod:`.attention`). ``mode = "fwd_bwd"`` measures a training step of the layer.

Cost model (docs/CONTRACTS.md): dense causal attention's FLOPs over the attended
pairs; bytes: Q, K and V read once and O written once (forward), plus, for
backward, Q, K, V, O and dO read once and dQ, dK and dV written once.
"""

from __future__ import annotations

import torch

from topk_bench.types import Mode
from topk_bench.workloads.attention import (
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


def build(case, device, dtype) -> Workload:
    p = PREFILL.shape(case)
    b, length, d = p["batch"], p["seq_len"], p["head_dim"]
    # Inputs first: the same case always gets the same inputs, whatever the implementation draws.
    q = queries(b, p["q_heads"], length, d).requires_grad_()
    k = keys_or_values(b, p["kv_heads"], length, d).requires_grad_()
    v = keys_or_values(b, p["kv_heads"], length, d).requires_grad_()
    model = AttentionLayer(case.impl, d, causal=True, activation=case.activation, **case.option_dict)
    return Workload(model, (q, k, v))


def attention_inputs(workload: Workload) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)``: the layer's inputs."""
    q, k, v = workload.inputs
    return q, k, v


def traffic(case) -> Traffic:
    p = PREFILL.shape(case)
    b, length, hq, hkv, d = p["batch"], p["seq_len"], p["q_heads"], p["kv_heads"], p["head_dim"]
    per_token = element_size(case.dtype) * b * length * d  # bytes of one head's [B, L, d]
    moved = (2 * hq + 2 * hkv) * per_token  # forward: Q, K, V read, O written
    if case.mode.backward:
        moved += (4 * hq + 4 * hkv) * per_token  # backward: Q, K, V, O, dO read, dQ, dK, dV written
    return Traffic(
        flops=attention_flops(b, hq, length, length, d, causal=True, mode=case.mode),
        bytes=moved,
        tokens=b * length,
        tokens_per_sequence=length,
    )


PREFILL = register(
    WorkloadSpec(
        name="prefill",
        description="one causal attention layer over a prompt, q/k/v inputs, grouped K/V heads (no projections)",
        build=build,
        # model "custom": the head counts below (Llama-3-8B's attention); a named model sets them.
        params={"model": CUSTOM, "seq_len": 1024, "batch": 1, "q_heads": 32, "kv_heads": 8, "head_dim": 128},
        presets={"model": MODELS},
        causal=True,
        fixed={"causal": Fixed(True, "prefill is causal attention: expected causal = true")},
        mode=Mode.FWD,
        check_params=heads_group,
        grouped_heads=grouped,
        traffic=traffic,
        attention_inputs=attention_inputs,
    )
)
