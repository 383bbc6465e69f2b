"""``mha``: one multi-head self-attention layer (paper Fig. 1 and 2), BERT-base by default."""

from __future__ import annotations

from implementations import MultiHeadAttention
from topk_bench.protocol import OURS, PAPER
from topk_bench.workloads.protocol import attention_layer
from topk_bench.workloads.spec import Workload, WorkloadSpec, hidden_states, register


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


MHA = register(
    WorkloadSpec(
        name="mha",
        description="one multi-head self-attention layer: Q/K/V/O projections around the attention",
        build=build,
        params={"seq_len": 512, "batch": 1, "d_model": 768, "heads": 12},  # BERT-base (paper §3)
        check_params=heads_divide_d_model,
        protocols=(OURS.name, PAPER.name),
    )
)
