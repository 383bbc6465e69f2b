"""``decoder``: a causal post-LN Transformer decoder (paper Fig. 3a), BERT-base with 12 layers by default.

The attention implementation (``impl``) and the feed-forward one (``feedforward``
of an ``[[impl]]``, default vanilla) are chosen independently: the paper uses
top-64 attention with query-chunked feed-forward layers.

Cost model (docs/CONTRACTS.md): ``layers`` times an attention layer's and a feed-forward layer's (``mha``, ``ff``).
"""

from __future__ import annotations

from topk_bench.attention import Decoder
from topk_bench.protocol import OURS, PAPER
from topk_bench.workloads import ff, mha
from topk_bench.workloads.mha import heads_divide_d_model
from topk_bench.workloads.protocol import attention_layer
from topk_bench.workloads.spec import Fixed, Traffic, Workload, WorkloadSpec, hidden_states, register

DEFAULT_FEEDFORWARD = "vanilla"  # an [[impl]] that names no feed-forward implementation gets this one


def build(case, device, dtype) -> Workload:
    p = DECODER.shape(case)
    layer = attention_layer(case, p["seq_len"], device)  # one mask for all layers, as the authors'
    model = Decoder(
        p["layers"],
        p["d_model"],
        p["heads"],
        p["d_ff"],
        attention=case.impl,
        feedforward=case.ff_impl or DEFAULT_FEEDFORWARD,
        # Every block passes these to its MultiHeadAttention (scale_in_attention is the layer's own).
        attention_options={**layer.options, **case.option_dict},
        feedforward_options=case.ff_option_dict,
    )
    return Workload(model, (hidden_states(p["batch"], p["seq_len"], p["d_model"], device, dtype),), layer.kept)


def traffic(case) -> Traffic:
    p = DECODER.shape(case)
    attention = mha.layer_cost(p, causal=case.causal, dtype=case.dtype, mode=case.mode)
    feedforward = ff.layer_cost(p, dtype=case.dtype, mode=case.mode)
    return Traffic(
        flops=p["layers"] * (attention[0] + feedforward[0]),
        bytes=p["layers"] * (attention[1] + feedforward[1]),
        tokens=p["batch"] * p["seq_len"],
        tokens_per_sequence=p["seq_len"],
    )


DECODER = register(
    WorkloadSpec(
        name="decoder",
        description="causal post-LN decoder: N blocks of attention and feed-forward, chosen independently",
        build=build,
        params={"seq_len": 512, "batch": 1, "d_model": 768, "heads": 12, "d_ff": 3072, "layers": 12},
        causal=True,
        fixed={"causal": Fixed(True, "the decoder is causal: expected causal = true")},
        feedforward=True,
        default_feedforward=DEFAULT_FEEDFORWARD,
        check_params=heads_divide_d_model,
        legend=lambda attention, feedforward: f"{attention} + {feedforward} FF",
        traffic=traffic,
        protocols=(OURS.name, PAPER.name),
    )
)
