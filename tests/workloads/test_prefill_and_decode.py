"""The prefill and decode workloads, through the harness's own builders, in float64 at 1e-10: a decode step
equals the last rows of the causal prefill over the whole sequence; grouped K/V heads equal K/V repeated per
group; the cache is built before the measured region and counted exactly; the support rule for implementations
without grouped-query support; the cost model against the tensors the workloads build."""

from __future__ import annotations

import pytest
import torch

from topk_bench import attention, workloads
from topk_bench.case import Case, Measurement
from topk_bench.predict.backends import predict
from topk_bench.results import rates
from topk_bench.results.row import make_row
from topk_bench.workloads.attention import attended_pairs
from topk_bench.workloads.support import unsupported

pytestmark = pytest.mark.usefixtures("single_thread")

# Options small enough that every selection happens on these lengths (13 cached + up to 3 new keys).
OPTIONS = {
    "qchunk": {"chunk_size": 3},
    "topk": {"topk": 4, "chunk_size": 3},
    "topk_fast": {"topk": 4, "chunk_size": 3},
    "topk_sparse": {"topk": 4, "chunk_size": 3},
    "performer": {"nb_features": 16, "chunk_size": 3},
    "page_topk": {"page_size": 4, "token_budget": 8, "chunk_size": 3},
    "sink_window": {"sinks": 2, "window": 4},
    "block_topk": {"block_size": 4, "topk_blocks": 2, "chunk_size": 3},
    "nsa": {
        "compress_block": 2,
        "compress_stride": 1,
        "select_block": 4,
        "select_blocks": 3,
        "window": 3,
        "chunk_size": 3,
    },
    "dsa": {"topk": 4, "chunk_size": 3, "index_heads": 2, "index_head_dim": 4},
}
# Grouped-query support, causal softmax, and run in milliseconds (flex compiles for seconds per shape).
GROUPED = [
    n for n in attention.names() if attention.spec(n).gqa is not None and attention.spec(n).causal and n != "flex"
]
HEADS = [(4, 2), (4, 1), (2, 2)]  # (q_heads, kv_heads): grouped, multi-query, multi-head


def _case(workload, impl, dtype="float64", mode="fwd", options=None, **params):
    return Case.make(
        suite="t",
        workload=workload,
        impl=impl,
        params=params,
        options={**OPTIONS.get(impl, {}), **(options or {})},
        mode=mode,
        causal=True,
        dtype=dtype,
    )


def _build(case):
    wl = workloads.build(case, "cpu", getattr(torch, case.dtype))
    if case.mode == "fwd":
        for t in wl.inputs:
            t.requires_grad_(False)
    return wl


def test_every_implementation_with_grouped_heads_is_in_these_tests():
    assert {"vanilla", "sdpa", "topk", "topk_fast", "page_topk", "sink_window", "block_topk"} <= set(GROUPED)
    assert set(GROUPED) <= {"vanilla", "sdpa", *OPTIONS}


@pytest.mark.parametrize("new_tokens", [1, 3])
@pytest.mark.parametrize("q_heads,kv_heads", HEADS)
@pytest.mark.parametrize("impl", GROUPED)
def test_decode_equals_the_last_rows_of_prefill(impl, q_heads, kv_heads, new_tokens):
    cached = 13
    heads = dict(batch=2, q_heads=q_heads, kv_heads=kv_heads, head_dim=8)
    prefill = _build(_case("prefill", impl, seq_len=cached + new_tokens, **heads))
    decode = _build(_case("decode", impl, kv_len=cached, new_tokens=new_tokens, **heads))
    decode.model.layer.load_state_dict(prefill.model.state_dict())  # Performer's random features
    q, k, v = prefill.inputs
    _, k_new, v_new, k_cache, v_cache = decode.inputs
    with torch.no_grad():
        decode.inputs[0].copy_(q[..., cached:, :])
        k_new.copy_(k[..., cached:, :])
        v_new.copy_(v[..., cached:, :])
        k_cache.copy_(k)
        v_cache.copy_(v)
        # What is kept with the cache (page summaries, nsa's compressed K/V) is built with the cache, the new
        # tokens' K/V in it (as the workload builds it: the step writes the same values again).
        decode.model.refresh_state(k_cache, v_cache)
        k_cache[..., cached:, :].fill_(1e3)  # the room for the new tokens: the step must overwrite it
        v_cache[..., cached:, :].fill_(1e3)
        want = prefill()[..., cached:, :]
        got = decode()
    assert got.shape == (2, q_heads, new_tokens, 8)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(k_cache, k, rtol=0, atol=0)  # the step wrote its K/V in place, nothing else


@pytest.mark.parametrize("q_heads,kv_heads", HEADS[:2])
@pytest.mark.parametrize("impl", GROUPED)
@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_grouped_heads_equal_repeated_kv_through_the_workload(workload, impl, q_heads, kv_heads):
    """Each implementation with grouped K/V equals itself (exact ones: vanilla) on K/V repeated per group."""
    size = {"seq_len": 11} if workload == "prefill" else {"kv_len": 11, "new_tokens": 2}
    # page_topk's default shares a group's pages: with repeated K/V every head is its own group. NSA shares its
    # block selection in a group always: every block selected (13 keys: 4 blocks of 4), no group dependence;
    # dsa selects per K/V group too: every key selected.
    per_head = {"page_topk": {"group_pages": False}, "nsa": {"select_blocks": 4}, "dsa": {"topk": 16}}.get(impl, {})
    grouped = _build(
        _case(workload, impl, options=per_head, batch=2, q_heads=q_heads, kv_heads=kv_heads, head_dim=8, **size)
    )
    reference = "vanilla" if attention.spec(impl).exact else impl
    full = _build(
        _case(workload, reference, options=per_head, batch=2, q_heads=q_heads, kv_heads=q_heads, head_dim=8, **size)
    )
    if reference == impl:
        full.model.load_state_dict(grouped.model.state_dict())
    groups = q_heads // kv_heads
    with torch.no_grad():
        for mine, theirs in zip(grouped.inputs, full.inputs):
            repeat = groups if theirs.shape[1] != mine.shape[1] else 1
            theirs.copy_(mine.repeat_interleave(repeat, dim=1))
        if workload == "decode":  # the state kept with the cache follows its new contents
            full.model.refresh_state(full.inputs[3], full.inputs[4])
        torch.testing.assert_close(grouped(), full(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", ["vanilla", "sdpa", "topk", "qchunk"])
def test_prefill_forward_and_backward_with_grouped_heads_equals_repeated_kv(impl):
    params = dict(seq_len=9, batch=1, head_dim=8)
    grouped = _build(_case("prefill", impl, mode="fwd_bwd", q_heads=4, kv_heads=2, **params))
    full = _build(_case("prefill", impl, mode="fwd_bwd", q_heads=4, kv_heads=4, **params))
    q, k, v = grouped.inputs
    rq, rk, rv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref_out = full.model(rq, rk.repeat_interleave(2, dim=1), rv.repeat_interleave(2, dim=1))
    out = grouped()
    g = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref_out, (rq, rk, rv), g)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-10)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


# -- the support rule ----------------------------------------------------------


def test_an_implementation_without_grouped_heads_is_unsupported_only_where_heads_are_grouped():
    assert attention.spec("vanilla_paper").gqa is None
    grouped = _case("decode", "vanilla_paper", q_heads=4, kv_heads=2, head_dim=8, kv_len=8)
    assert "does not support grouped K/V heads" in unsupported(grouped, predict=True)
    assert (
        unsupported(_case("decode", "vanilla_paper", q_heads=4, kv_heads=4, head_dim=8, kv_len=8), predict=True) is None
    )
    assert unsupported(_case("prefill", "vanilla", q_heads=4, kv_heads=2, head_dim=8, seq_len=8), predict=True) is None


def test_a_model_preset_decides_whether_heads_are_grouped():
    bert = _case("prefill", "vanilla_paper", model="bert-base", seq_len=8)
    llama = _case("prefill", "vanilla_paper", model="llama-3-8b", seq_len=8)
    assert unsupported(bert, predict=True) is None
    assert unsupported(llama, predict=True)


# -- the cache, the cost model, the rates ----------------------------------------


def _llama_decode(kv_len, batch=1, dtype="bfloat16", impl="sdpa"):
    return Case.make(
        suite="t",
        workload="decode",
        impl=impl,
        method="predicted",
        dtype=dtype,
        mode="fwd",
        causal=True,
        params={
            "model": "llama-3-8b",
            "kv_len": kv_len,
            "batch": batch,
            "new_tokens": 1,
            **workloads.lookup("decode").presets["model"]["llama-3-8b"],
        },
    )


def test_predicted_kv_cache_bytes_of_llama_3_8b_at_128k_tokens():
    case = _llama_decode(131072)
    traffic = workloads.traffic(case)
    assert traffic.kv_cache_bytes == 2 * 8 * 128 * 131072 * 2
    measurement = predict(case, None)
    row = make_row(case, measurement, traffic=traffic)
    assert row["kv_cache_bytes"] == 2 * 8 * 128 * 131072 * 2
    # Before the measured region: the cache with room for the new token, the new token's q, k, v.
    room = 2 * 8 * 128 * (131072 + 1) * 2
    assert measurement.baseline_bytes == room + (32 + 2 * 8) * 128 * 2
    assert 0 < measurement.peak_bytes - measurement.baseline_bytes < 2**20  # the step's own memory: no cache copy


@pytest.mark.parametrize("impl", ["vanilla", "sdpa", "topk", "topk_fast", "page_topk", "sink_window", "block_topk"])
def test_a_decode_step_never_copies_the_cache(impl):
    """The step's memory above its inputs stays below one of K and V (a concatenation would copy both;
    page_topk's per-step page summaries, issue 16's to move with the cache, take a quarter of the cache)."""
    measurement = predict(_llama_decode(16384, batch=2, impl=impl), None)
    keys = 2 * 8 * 128 * 16384 * 2
    assert measurement.peak_bytes - measurement.baseline_bytes < keys, impl


@pytest.mark.parametrize("lq,lk", [(1, 1), (1, 9), (3, 9), (9, 9), (9, 4), (5, 7)])
def test_attended_pairs_count_the_bottom_right_causal_mask(lq, lk):
    i = torch.arange(lq).unsqueeze(1)
    j = torch.arange(lk)
    assert attended_pairs(lq, lk, causal=True) == int((j <= lk - lq + i).sum())
    assert attended_pairs(lq, lk, causal=False) == lq * lk


def _output_bytes(wl):
    with torch.no_grad():
        out = wl()
    return out.numel() * out.element_size()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_bytes_moved_is_q_and_o_the_new_kv_twice_and_the_whole_cache(dtype):
    case = _case("decode", "vanilla", dtype=dtype, batch=2, q_heads=4, kv_heads=2, head_dim=8, kv_len=13, new_tokens=3)
    q, k_new, v_new, k_cache, v_cache = (t.numel() * t.element_size() for t in _build(case).inputs)
    traffic = workloads.traffic(case)
    assert traffic.bytes == q + _output_bytes(_build(case)) + 2 * (k_new + v_new) + k_cache + v_cache
    assert traffic.kv_cache_bytes == (k_cache + v_cache) * 13 // 16
    assert (traffic.tokens, traffic.tokens_per_sequence) == (2 * 3, 3)
    assert traffic.flops == 4 * 2 * 4 * attended_pairs(3, 16, True) * 8


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_prefill_bytes_moved_is_qkv_and_o_once_forward_and_backward_twice_more(mode):
    case = _case("prefill", "vanilla", mode=mode, batch=2, q_heads=4, kv_heads=2, head_dim=8, seq_len=10)
    wl = _build(case)
    once = sum(t.numel() * t.element_size() for t in wl.inputs) + _output_bytes(wl)
    traffic = workloads.traffic(case)
    # backward: reads Q, K, V, O, dO and writes dQ, dK, dV, each the size of its forward tensor
    assert traffic.bytes == (once if mode == "fwd" else 3 * once)
    assert traffic.flops == 4 * 2 * 4 * (10 * 11 // 2) * 8 * (1 if mode == "fwd" else 3.5)


def test_rates_are_the_traffic_over_the_median_time():
    traffic = workloads.Traffic(flops=1000, bytes=300, tokens=8, tokens_per_sequence=2, kv_cache_bytes=64)
    row = rates.columns(traffic, Measurement(status="ok", times_s=[2.0, 1.0, 5.0]))
    assert row == {
        "kv_cache_bytes": 64,
        "model_flops": 1000,
        "bytes_moved": 300,
        "tokens": 8,
        "flops_per_s": 500.0,
        "bytes_per_s": 150.0,
        "tokens_per_s": 4.0,
        "time_per_token_s": 1.0,
    }
    predicted = rates.columns(traffic, Measurement(status="ok"))
    assert predicted["kv_cache_bytes"] == 64 and predicted["flops_per_s"] is None
    assert predicted["time_per_token_s"] is None
    no_cache = workloads.Traffic(flops=1, bytes=1, tokens=1, tokens_per_sequence=1)
    assert "kv_cache_bytes" not in rates.columns(no_cache, Measurement(status="ok"))
    assert rates.columns(None, Measurement(status="ok")) == {}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("impl", GROUPED)
@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_half_precision_through_the_workload_is_close_to_float32(workload, impl, dtype):
    size = {"seq_len": 40} if workload == "prefill" else {"kv_len": 40, "new_tokens": 2}
    params = dict(batch=1, q_heads=4, kv_heads=2, head_dim=16, **size)
    # The same keys as float32 (topk_fast ranks half inputs by their own product unless asked).
    options = {"float_scores": True} if impl == "topk_fast" else None
    half = _build(_case(workload, impl, dtype=dtype, options=options, **params))
    full = _build(_case(workload, impl, dtype="float32", options=options, **params))
    full.model.load_state_dict(half.model.state_dict())
    with torch.no_grad():
        for mine, theirs in zip(half.inputs, full.inputs):
            theirs.copy_(mine)  # the same (rounded) values in float32
        out, want = half(), full()
    assert out.dtype == getattr(torch, dtype) and torch.isfinite(out).all()
    # Half outputs round to 2^-8 (bfloat16) relative; Performer's random features add their own rounding.
    torch.testing.assert_close(out.float(), want, rtol=0.05, atol=0.05 if impl == "performer" else 0.02)
