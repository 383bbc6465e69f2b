"""Synthetic peaked inputs (topk_bench/extras/peaked.py) and the quality = ["peaked"] columns they feed: the
generator is reproducible and has the three structures it promises; the columns are computed for any selection
method (nsa, topk_fast, block_topk) and tell a peaked head from a flat one."""

from __future__ import annotations

import pytest
import torch

from topk_bench.case import Case
from topk_bench.extras import columns as extras
from topk_bench.extras import quality
from topk_bench.extras.peaked import SINKS, peaked_qkv
from topk_bench.workloads.attention import with_budget

SHAPE = {"q_heads": 4, "kv_heads": 2, "head_dim": 32, "new_tokens": 1, "batch": 1}


def _case(impl, kv_len, budget, kinds=("peaked",), options=None):
    return Case.make(
        suite="t",
        workload="decode",
        impl=impl,
        params={**SHAPE, "kv_len": kv_len, "budget": budget},
        options=with_budget(impl, options or {}, budget),
        mode="fwd",
        causal=True,
        dtype="float64",
        quality=kinds,
    )


def test_the_same_seed_draws_the_same_inputs_and_another_seed_others():
    a = peaked_qkv(1, 4, 2, 3, 100, 32, seed=5)
    b = peaked_qkv(1, 4, 2, 3, 100, 32, seed=5)
    c = peaked_qkv(1, 4, 2, 3, 100, 32, seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[1], c[1])
    assert [tuple(x.shape) for x in a] == [(1, 4, 3, 32), (1, 2, 100, 32), (1, 2, 100, 32)]


def test_a_head_too_narrow_for_the_structures_is_refused():
    with pytest.raises(ValueError, match="peaked inputs need head_dim >= 20"):
        peaked_qkv(1, 1, 1, 1, 10, 16)


def test_sinks_recent_keys_and_heavy_hitters_draw_more_than_their_share():
    """Mass per key, against the uniform share 1/Lk, averaged over heads and the last 8 queries."""
    lk = 4096
    q, k, _ = peaked_qkv(2, 8, 4, 8, lk, 64, seed=0)
    probs = torch.softmax(quality.attention_scores(q, k).masked_fill(~quality.allowed_mask(8, lk, True), -1e300), -1)
    per_key = probs.mean(dim=(0, 1, 2)) * lk  # 1 = its share
    # The heavy-hitter coordinate marks them, per K/V head: their mass for the query heads of that head.
    heavy = (k[..., -1] > 0).repeat_interleave(2, dim=1)  # [B, Hq, Lk]
    per_head_key = probs.mean(dim=2) * lk
    assert per_key[:SINKS].mean() > 50
    assert per_key[-24:].mean() > 5  # the recent keys (the last ones only some of the 8 queries see)
    assert per_head_key[heavy].mean() > 10
    # And a flat head: random Gaussian q, k keep about their share everywhere.
    flat = torch.softmax(quality.attention_scores(torch.randn(1, 8, 8, 64) / 8, torch.randn(1, 4, lk, 64)), -1)
    assert (flat.mean(dim=(0, 1, 2)) * lk)[:SINKS].mean() < 3


@pytest.mark.parametrize(
    "impl, options",
    [
        ("nsa", {"compress_block": 8, "compress_stride": 4, "select_block": 16, "window": 32}),
        ("topk_fast", {}),
        ("block_topk", {"block_size": 16}),
    ],
)
def test_every_selection_method_reports_its_peaked_quality(impl, options):
    columns = extras.extra_columns(_case(impl, 511, 128, options=options), None)
    assert set(columns) == {
        "peaked_topk_recall",
        "peaked_mass_recall",
        "peaked_attn_rel_err",
        "peaked_attended_fraction",
    }
    assert 0 < columns["peaked_mass_recall"] <= 1 and 0 < columns["peaked_topk_recall"] <= 1
    assert 0 < columns["peaked_attended_fraction"] < 1


def test_nsa_attending_every_key_keeps_all_mass_yet_its_compressed_branch_differs_from_attention():
    options = {"compress_block": 8, "compress_stride": 4, "select_block": 16, "window": 32}
    columns = extras.quality_columns(_case("nsa", 255, 256, options=options))
    assert columns["peaked_mass_recall"] == pytest.approx(1.0, abs=1e-12) and columns["peaked_topk_recall"] == 1.0
    assert columns["peaked_attn_rel_err"] > 1e-3  # a third of the output reads block means
    exact = extras.quality_columns(_case("topk_fast", 255, 256))
    assert exact["peaked_attn_rel_err"] < 1e-12


def test_peaked_inputs_separate_what_random_ones_do_not():
    """At a budget of 1/16 of the keys, exact top-k keeps most of a peaked head's mass, and much less of a
    flat (random) head's."""
    columns = extras.quality_columns(_case("topk_fast", 1023, 64, kinds=("random", "peaked")))
    assert columns["peaked_mass_recall"] > 0.5 and columns["peaked_mass_recall"] > 1.5 * columns["mass_recall"]
