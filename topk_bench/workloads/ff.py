"""``ff``: one feed-forward layer cast as attention, ``ReLU(Q Kᵀ) V`` with keys W1 and values W2ᵀ (paper Fig. 3b).

``batch x seq_len`` tokens are its queries (the paper uses 512 x 512 = 2^18).

Cost model (docs/CONTRACTS.md): the two products' FLOPs; bytes: the input read and the output written, W1 and
W2 read, the hidden activations written and read once (forward), three times that with the backward.
"""

from __future__ import annotations

from topk_bench.attention import FeedForward
from topk_bench.protocol import OURS, PAPER
from topk_bench.types import Mode
from topk_bench.workloads.attention import element_size
from topk_bench.workloads.spec import Fixed, Traffic, Workload, WorkloadSpec, hidden_states, register


def build(case, device, dtype) -> Workload:
    # The paper protocol changes nothing here: the authors' feed-forward layer scales nothing and has no mask.
    p = FF.shape(case)
    model = FeedForward(p["d_model"], p["d_ff"], case.impl, **case.option_dict)
    return Workload(model, (hidden_states(p["batch"], p["seq_len"], p["d_model"], device, dtype),))


def layer_cost(p, *, dtype: str, mode: str) -> tuple[int, int]:
    """(FLOPs, bytes) of one feed-forward layer of shape ``p`` (``batch``, ``seq_len``, ``d_model``, ``d_ff``)."""
    tokens, d, hidden = p["batch"] * p["seq_len"], p["d_model"], p["d_ff"]
    flops = 4 * tokens * d * hidden  # x W1ᵀ and h W2, 2 per multiply-add
    moved = element_size(dtype) * (2 * tokens * d + 2 * d * hidden + 2 * tokens * hidden)
    return (flops * 3, moved * 3) if Mode(mode).backward else (flops, moved)


def traffic(case) -> Traffic:
    p = FF.shape(case)
    flops, moved = layer_cost(p, dtype=case.dtype, mode=case.mode)
    return Traffic(flops=flops, bytes=moved, tokens=p["batch"] * p["seq_len"], tokens_per_sequence=p["seq_len"])


FF = register(
    WorkloadSpec(
        name="ff",
        description="one feed-forward layer as attention: ReLU(x W1ᵀ) W2 with d_ff learned keys",
        build=build,
        params={"seq_len": 512, "batch": 1, "d_model": 768, "d_ff": 3072},
        activation="relu",
        fixed={
            "causal": Fixed(False, "the feed-forward workload has no mask: expected causal = false"),
            "activation": Fixed("relu", "the feed-forward workload is ReLU(Q Kᵀ) V: expected activation = 'relu'"),
        },
        traffic=traffic,
        protocols=(OURS.name, PAPER.name),
    )
)
