"""Estimate (not a test): paper-protocol peaks with the dropout memory of CUDA instead of the CPU's.

    python scripts/predict_cuda_dropout.py

Predictions run the CPU's ``F.dropout``, which keeps a float32 noise tensor (4 bytes an element)
for backward; on CUDA, where the paper measured, dropout is one fused kernel that keeps a bool
mask (1 byte) and makes no float temporary. This predicts the cases docs/REPRODUCTION.md quotes
twice, as the harness does and with ``F.dropout`` replaced by a stand-in with the fused kernel's
memory (output and bool mask; values do not matter under FakeTensorMode). Only what dropout keeps
alive through the peak changes: vanilla's whole-matrix masks, not the chunked variants' per-chunk
ones (already freed at their backward peak).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from topk_bench.case import Budget, Case
from topk_bench.predict.backends import predict

GIB = 1 << 30
MHA = {"batch": 1, "d_model": 768, "heads": 12}
FF = {"batch": 512, "seq_len": 512, "d_model": 768}
DECODER = {"batch": 1, "d_model": 768, "heads": 12, "d_ff": 3072, "layers": 12}
# (workload, attention, its options, parameters, feed-forward, its options): the settings of suites/paper/.
CASES = [
    ("mha", "vanilla_paper", {}, {**MHA, "seq_len": 8192}, None, {}),
    ("mha", "vanilla_paper", {}, {**MHA, "seq_len": 16384}, None, {}),
    ("mha", "qchunk_paper", {"chunk_size": 1024}, {**MHA, "seq_len": 65536}, None, {}),
    ("mha", "topk_paper", {"chunk_size": 1024, "topk": 128}, {**MHA, "seq_len": 65536}, None, {}),
    ("ff", "vanilla_paper", {}, {**FF, "d_ff": 2048}, None, {}),
    ("ff", "vanilla_paper", {}, {**FF, "d_ff": 4096}, None, {}),
    ("ff", "qchunk_paper", {"chunk_size": 16384}, {**FF, "d_ff": 65536}, None, {}),
    ("ff", "topk_paper", {"chunk_size": 16384, "topk": 512}, {**FF, "d_ff": 65536}, None, {}),
    ("decoder", "vanilla_paper", {}, {**DECODER, "seq_len": 2048}, "vanilla_paper", {}),
    ("decoder", "vanilla_paper", {}, {**DECODER, "seq_len": 4096}, "vanilla_paper", {}),
    (
        "decoder",
        "topk_paper",
        {"chunk_size": 1024, "topk": 64},
        {**DECODER, "seq_len": 32768},
        "qchunk_paper",
        {"chunk_size": 4096},
    ),
]


class FusedDropout(torch.autograd.Function):
    """The memory of CUDA's fused dropout: a new output and a bool mask, kept for backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(torch.empty_like(x, dtype=torch.bool))
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.empty_like(grad)


def fused_dropout(x, p=0.5, training=True, inplace=False):
    return FusedDropout.apply(x) if training and p > 0 else x


def peak(case: Case, *, fused: bool) -> int:
    saved = F.dropout
    if fused:
        F.dropout = fused_dropout  # the paper variants call F.dropout at run time
    try:
        return predict(case, Budget()).peak_bytes
    finally:
        F.dropout = saved


def main() -> None:
    for workload, impl, options, params, ff, ff_options in CASES:
        case = Case.make(
            suite="estimate",
            workload=workload,
            impl=impl,
            params=params,
            options=options,
            ff_impl=ff,
            ff_options=ff_options,
            causal=workload != "ff",
            activation="relu" if workload == "ff" else "softmax",
            method="predicted",
            protocol="paper",
        )
        size = params.get("d_ff") if workload == "ff" else params["seq_len"]
        cpu, cuda = peak(case, fused=False), peak(case, fused=True)
        print(
            f"{workload:8} {impl:14} {size:6}: CPU dropout {cpu / GIB:7.2f} GiB, CUDA dropout {cuda / GIB:7.2f} GiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
