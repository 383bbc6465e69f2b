"""``mha``: one multi-head self-attention layer (paper Fig. 1 and 2), BERT-base by default.

Cost model (docs/CONTRACTS.md): the four projections' FLOPs and dense attention's over the attended pairs;
bytes: the input read and the output written, the projections' weights read, Q, K, V and O each written and
read once (forward), three times that with the backward.
"""

from __future__ import annotations

from topk_bench.attention import MultiHeadAttention
from topk_bench.protocol import OURS, PAPER
from topk_bench.types import Mode
from topk_bench.workloads.attention import attention_flops, element_size, projections_flops
from topk_bench.workloads.protocol import attention_layer
from topk_bench.workloads.spec import Traffic, Workload, WorkloadSpec, hidden_states, register


def heads_divide_d_model(params) -> tuple[str, str] | None:
    """BERT's head split: ``d_model`` must be a multiple of ``heads``."""
    if params["d_model"] % params["heads"]:
        return "heads", f"expected d_model ({params['d_model']}) divisible by heads ({params['heads']})"
    return None


def build(case, device, dtype) -> Workload:
    p = MHA.shape(case)
    layer = attention_layer(case, p["seq_len"], device)
    model = MultiHeadAttention(
        p["d_model"],
        p["heads"],
        case.impl,
        causal=case.causal,
        activation=case.activation,
        **layer.options,
        **case.option_dict,
    )
    return Workload(model, (hidden_states(p["batch"], p["seq_len"], p["d_model"], device, dtype),), layer.kept)


def layer_cost(p, *, causal: bool, dtype: str, mode: str) -> tuple[int, int]:
    """(FLOPs, bytes) of one attention layer of shape ``p`` (``batch``, ``seq_len``, ``d_model``, ``heads``)."""
    b, length, d, heads = p["batch"], p["seq_len"], p["d_model"], p["heads"]
    flops = projections_flops(b, length, d, mode=mode) + attention_flops(
        b, heads, length, length, d // heads, causal=causal, mode=mode
    )
    # x read and y written, Q, K, V and O written and read once, the weights and biases read.
    moved = element_size(dtype) * (10 * b * length * d + 4 * d * (d + 1))
    return flops, moved * 3 if Mode(mode).backward else moved


def traffic(case) -> Traffic:
    p = MHA.shape(case)
    flops, moved = layer_cost(p, causal=case.causal, dtype=case.dtype, mode=case.mode)
    return Traffic(flops=flops, bytes=moved, tokens=p["batch"] * p["seq_len"], tokens_per_sequence=p["seq_len"])


MHA = register(
    WorkloadSpec(
        name="mha",
        description="one multi-head self-attention layer: Q/K/V/O projections around the attention",
        build=build,
        params={"seq_len": 512, "batch": 1, "d_model": 768, "heads": 12},  # BERT-base (paper §3)
        check_params=heads_divide_d_model,
        traffic=traffic,
        protocols=(OURS.name, PAPER.name),
    )
)
