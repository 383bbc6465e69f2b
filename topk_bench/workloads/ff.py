"""``ff``: one feed-forward layer cast as attention, ``ReLU(Q Kᵀ) V`` with keys W1 and values W2ᵀ (paper Fig. 3b).

``batch x seq_len`` tokens are its queries (the paper uses 512 x 512 = 2^18).
"""

from __future__ import annotations

from implementations import FeedForward
from topk_bench.protocol import OURS, PAPER
from topk_bench.workloads.spec import Fixed, Workload, WorkloadSpec, hidden_states, register


def build(case, device, dtype) -> Workload:
    # The paper protocol changes nothing here: the authors' feed-forward layer scales nothing and has no mask.
    p = FF.shape(case)
    model = FeedForward(p["d_model"], p["d_ff"], case.impl, **case.option_dict)
    return Workload(model, (hidden_states(p["batch"], p["seq_len"], p["d_model"], device, dtype),))


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
        protocols=(OURS.name, PAPER.name),
    )
)
