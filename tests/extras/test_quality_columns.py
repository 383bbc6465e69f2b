"""Selection quality through the harness (issue 16): the quality extra on a case's own inputs, the token budget
each method reads, page summaries kept with the decode cache and counted in kv_cache_bytes."""

from __future__ import annotations

import math

import pytest
import torch

from topk_bench import workloads
from topk_bench.case import Case, Measuring
from topk_bench.extras import columns as extras
from topk_bench.predict.backends import predict
from topk_bench.suite import load
from topk_bench.suite.sweep import expand
from topk_bench.types import DType, Method
from topk_bench.workloads.attention import with_budget

SHAPE = {"q_heads": 2, "kv_heads": 1, "head_dim": 4, "new_tokens": 1, "batch": 1}


def _case(impl, kv_len, budget=0, dtype="float64", options=None, method="measured"):
    """A decode case as a suite's sweep makes it: the budget in the method's own options."""
    return Case.make(
        suite="t",
        workload="decode",
        impl=impl,
        params={**SHAPE, "kv_len": kv_len, "budget": budget},
        options=with_budget(impl, options or {}, budget),
        mode="fwd",
        causal=True,
        dtype=dtype,
        method=method,
        quality=("random",),
    )


def test_sink_window_quality_by_hand_through_the_extra():
    # 7 cached tokens + 1 new: the query at position 7 attends sink 0 and the window 6, 7 (3 of 8 keys).
    case = _case("sink_window", 7, options={"sinks": 1, "window": 2})
    columns = extras.extra_columns(case, None)
    wl = workloads.build(case, "cpu", torch.float64)
    q, k, v = workloads.lookup("decode").attention_inputs(wl)
    attended = [0, 6, 7]
    scores = q[0].double() @ k[0, 0].double().T  # [2 heads, 1, 8]
    probs = scores.softmax(-1)
    mass = probs[..., attended].sum(-1).mean()
    top3 = scores.topk(3, dim=-1).indices
    hits = torch.tensor([[len(set(row.tolist()) & set(attended)) for row in head] for head in top3]).double() / 3
    sub = (scores[..., attended]).softmax(-1) @ v[0, 0, attended].double()
    exact = probs @ v[0, 0].double()
    assert columns["mass_recall"] == pytest.approx(float(mass), abs=1e-12)
    assert columns["topk_recall"] == pytest.approx(float(hits.mean()), abs=1e-12)
    assert columns["attn_rel_err"] == pytest.approx(float((sub - exact).norm() / exact.norm()), rel=1e-9)
    assert columns["attended_fraction"] == pytest.approx(3 / 8)


@pytest.mark.parametrize(
    "impl, options",
    [("page_topk", {"page_size": 4}), ("topk_fast", {}), ("sink_window", {}), ("block_topk", {"block_size": 4})],
)
def test_a_budget_covering_the_whole_cache_is_exact_in_float64(impl, options):
    columns = extras.quality_columns(_case(impl, 31, budget=32, options=options))
    assert columns["topk_recall"] == 1.0 and columns["mass_recall"] == pytest.approx(1.0, abs=1e-12)
    assert columns["attended_fraction"] == 1.0 and columns["attn_rel_err"] < 1e-12


def test_a_small_budget_loses_mass_and_dense_attention_is_the_reference():
    small = extras.quality_columns(_case("page_topk", 63, budget=8, options={"page_size": 4}))
    assert (
        small["attended_fraction"] == pytest.approx(12 / 64)
        and 0 < small["mass_recall"] < 1
        and small["attn_rel_err"] > 0
    )
    dense = extras.quality_columns(_case("vanilla", 63, budget=8))
    assert dense == pytest.approx(
        {"mass_recall": 1.0, "topk_recall": 1.0, "attended_fraction": 1.0, "attn_rel_err": 0}, abs=1e-12
    )


def test_a_prediction_leaves_the_quality_columns_empty():
    assert extras.extra_columns(_case("page_topk", 31, budget=8, method="predicted"), None) == {}


def test_the_budget_sets_each_methods_own_option():
    suite = load.load_suite("suites/kv_selection.toml")
    cases = expand(
        suite,
        Measuring(
            method=Method.PREDICTED,
            device="cpu",
            dtype=DType.BFLOAT16,
            warmup=0,
            warmup_s=0.0,
            min_sample_s=0.0,
            repeats=1,
            timer=None,
            flush_l2=False,
            threads=1,
            gpu=None,
        ),
    )
    for case in cases:
        budget, o = case.param_dict["budget"], case.option_dict
        expected = {
            "page_topk": ("token_budget", budget),
            "topk_fast": ("topk", budget),
            "sink_window": ("window", budget - 4),
            "block_topk": ("topk_blocks", budget // 64),
            "flex": ("window", budget),
        }.get(case.impl)
        if expected:
            assert o[expected[0]] == expected[1], case
    assert {c.quality for c in cases} == {("random", "minilm")}

    # One curve per entry: a label does not freeze the option the budget sets.
    def entry(c):
        return (
            c.impl,
            c.option_dict.get("page_size"),
            c.option_dict.get("group_pages"),
            c.option_dict.get("float_scores"),
        )

    labels = {entry(c): set() for c in cases}
    for c in cases:
        labels[entry(c)].add(c.label)
    assert all(len(v) == 1 for v in labels.values()), labels
    assert {c.label for c in cases if c.impl == "topk_fast"} == {"topk_fast", "topk_fast (float32 ranking)"}


@pytest.mark.parametrize("page_size, kv_len", [(16, 4095), (8, 4096), (16, 100)])
def test_kv_cache_bytes_count_page_summaries_exactly(page_size, kv_len):
    params = {"model": "llama-3-8b", "kv_len": kv_len, "new_tokens": 1, "batch": 2}
    case = Case.make(
        suite="t",
        workload="decode",
        impl="page_topk",
        params=params,
        options={"page_size": page_size},
        mode="fwd",
        causal=True,
        dtype="bfloat16",
        method="predicted",
    )
    kv = 2 * 2 * 8 * kv_len * 128 * 2
    pages = math.ceil((kv_len + 1) / page_size)
    summaries = 2 * 8 * pages * 2 * 128 * 4  # min and max per page, float32 for bf16 keys
    assert workloads.traffic(case).kv_cache_bytes == kv + summaries
    dense = Case.make(
        suite="t",
        workload="decode",
        impl="sdpa",
        params=params,
        mode="fwd",
        causal=True,
        dtype="bfloat16",
        method="predicted",
    )
    assert workloads.traffic(dense).kv_cache_bytes == kv
    # Built with the cache, before the measured region: in the baseline, not in the step.
    assert predict(case, None).baseline_bytes - predict(dense, None).baseline_bytes == summaries


@pytest.mark.parametrize("block_size, kv_len", [(64, 4095), (64, 4096)])
def test_kv_cache_bytes_count_block_means_exactly(block_size, kv_len):
    params = {"model": "llama-3-8b", "kv_len": kv_len, "new_tokens": 1, "batch": 2}
    case = Case.make(
        suite="t",
        workload="decode",
        impl="block_topk",
        params=params,
        options={"block_size": block_size},
        mode="fwd",
        causal=True,
        dtype="bfloat16",
        method="predicted",
    )
    means = 2 * 8 * math.ceil((kv_len + 1) / block_size) * 128 * 4  # a float32 mean key per block
    assert workloads.traffic(case).kv_cache_bytes == 2 * 2 * 8 * kv_len * 128 * 2 + means
    dense = Case.make(
        suite="t",
        workload="decode",
        impl="sdpa",
        params=params,
        mode="fwd",
        causal=True,
        dtype="bfloat16",
        method="predicted",
    )
    assert predict(case, None).baseline_bytes - predict(dense, None).baseline_bytes == means


def test_the_decode_step_reads_the_summaries_built_with_its_cache():
    case = _case("page_topk", 31, budget=8, options={"page_size": 4})
    wl = workloads.build(case, "cpu", torch.float64)
    summaries = wl.model.layer.attention.options["summaries"]
    from topk_bench.attention.methods.page_topk import page_summaries

    assert torch.equal(summaries, page_summaries(wl.inputs[3], 4))  # the cache with the new token's K in it
