"""The cost model of the paper's layers (mha, ff, decoder): FLOPs as torch counts them for dense attention, bytes
and tokens; their rows get the rate columns, and a run's estimate reads them (topk_bench.run.estimate)."""

from __future__ import annotations

import pytest

from topk_bench import workloads
from topk_bench.case import Case
from topk_bench.predict.backends import predict
from topk_bench.results import rates


def _case(workload, impl="vanilla", mode="fwd", causal=False, activation="softmax", **params):
    return Case.make(
        suite="t",
        workload=workload,
        impl=impl,
        device="cpu",
        method="predicted",
        mode=mode,
        causal=causal,
        activation=activation,
        params=params,
    )


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_mha_flops_are_the_projections_and_dense_attention_as_torch_counts_them(mode):
    case = _case("mha", mode=mode, seq_len=64, d_model=32, heads=4, batch=2)
    traffic = workloads.traffic(case)
    # Vanilla without a mask: every pair, as FlopCounterMode counts; its backward is two forwards of attention,
    # the model's 2.5 (FlashAttention's convention, which recomputes the scores, as prefill's model says).
    attention = 4 * 2 * 4 * 64 * 64 * 8
    assert traffic.flops == predict(case, None).flops + (attention // 2 if mode == "fwd_bwd" else 0)
    assert (traffic.tokens, traffic.tokens_per_sequence) == (128, 64)
    forward = workloads.traffic(_case("mha", seq_len=64, d_model=32, heads=4, batch=2))
    assert traffic.bytes == (3 * forward.bytes if mode == "fwd_bwd" else forward.bytes)


def test_causal_mha_counts_the_attended_pairs_only():
    dense = workloads.traffic(_case("mha", seq_len=64, d_model=32, heads=4, batch=1))
    causal = workloads.traffic(_case("mha", causal=True, seq_len=64, d_model=32, heads=4, batch=1))
    projections = 2 * 64 * 32 * 32 * 4
    assert (causal.flops - projections) == pytest.approx((dense.flops - projections) * (64 * 65 / 2) / 64**2)


def test_ff_and_decoder_flops_as_torch_counts_them():
    ff = _case("ff", activation="relu", seq_len=16, d_model=8, d_ff=32, batch=2)
    assert workloads.traffic(ff).flops == predict(ff, None).flops
    decoder = _case("decoder", causal=True, seq_len=16, d_model=8, heads=2, d_ff=32, layers=3, batch=1)
    layer = workloads.traffic(_case("mha", causal=True, seq_len=16, d_model=8, heads=2, batch=1))
    ffl = workloads.traffic(_case("ff", activation="relu", seq_len=16, d_model=8, d_ff=32, batch=1))
    assert workloads.traffic(decoder).flops == 3 * (layer.flops + ffl.flops)


def test_their_rows_get_the_rate_columns():
    assert set(rates.names(workloads.traffic(_case("mha", seq_len=64)))) == set(rates.COLUMNS) - {"kv_cache_bytes"}
