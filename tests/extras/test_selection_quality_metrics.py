"""Selection-quality metrics on small cases whose values are worked out by hand in the comments."""

import math

import pytest
import torch

from topk_bench import attention
from topk_bench.extras import quality as sq

pytestmark = pytest.mark.usefixtures("single_thread")

L = math.log
T, F = True, False

# Row 0: probabilities 0.4, 0.1, 0.2, 0.3 (scores ln 4, ln 1, ln 2, ln 3), all keys allowed.
#   Selected {1, 3}: k = 2, the exact top-2 is {0, 3}, one hit -> top-k recall 1/2;
#   mass 0.1 + 0.3 = 0.4.
# Row 1: only keys 0, 1 allowed (scores ln 1, ln 3 -> probabilities 1/4, 3/4; the large
#   scores of keys 2, 3 are masked). Selected {1}: k = 1, top-1 is {1} -> recall 1; mass 0.75.
SCORES = torch.tensor([[L(4), L(1), L(2), L(3)], [L(1), L(3), 9.0, 9.0]])
ALLOWED = torch.tensor([[T, T, T, T], [T, T, F, F]])
SELECTED = torch.tensor([[F, T, F, T], [F, T, F, F]])


def test_topk_recall_by_hand():
    assert sq.topk_recall(SELECTED, SCORES, ALLOWED) == pytest.approx((0.5 + 1.0) / 2)  # 0.75
    assert sq.topk_recall(SELECTED[:1], SCORES[:1]) == pytest.approx(0.5)
    # Selecting the exact top-2 {0, 3} of row 0: recall 1.
    assert sq.topk_recall(torch.tensor([[T, F, F, T]]), SCORES[:1]) == 1.0


def test_mass_recall_by_hand():
    assert sq.mass_recall(SELECTED, SCORES, ALLOWED) == pytest.approx((0.4 + 0.75) / 2)  # 0.575
    assert sq.mass_recall(SELECTED[:1], SCORES[:1]) == pytest.approx(0.4)
    # Without the mask, row 1's probabilities are 1, 3, e^9, e^9 over 4 + 2 e^9: key 1 holds 3 / (4 + 2 e^9).
    assert sq.mass_recall(SELECTED[1:], SCORES[1:]) == pytest.approx(3 / (4 + 2 * math.exp(9)))


def test_rows_where_a_metric_is_undefined_are_left_out():
    # Row 2 selects nothing (top-k recall undefined, mass 0); row 3 has no allowed key (both undefined).
    scores = torch.cat([SCORES, torch.tensor([[L(1), L(1), L(2), L(4)], [0.0, 0.0, 0.0, 0.0]])])
    allowed = torch.cat([ALLOWED, torch.tensor([[T, T, T, T], [F, F, F, F]])])
    selected = torch.cat([SELECTED, torch.tensor([[F, F, F, F], [F, F, F, F]])])
    assert sq.topk_recall(selected, scores, allowed) == pytest.approx(0.75)
    assert sq.mass_recall(selected, scores, allowed) == pytest.approx((0.4 + 0.75 + 0.0) / 3)
    assert math.isnan(sq.topk_recall(selected[3:], scores[3:], allowed[3:]))


def test_ties_at_the_kth_score_count_as_top_k():
    # Scores 2, 2, 1: k = 1 and key 1 ties the best -> recall 1.
    assert sq.topk_recall(torch.tensor([[F, T, F]]), torch.tensor([[2.0, 2.0, 1.0]])) == 1.0
    # k = 2 with keys {1, 2}: the top-2 is {0, 1} (scores 2, 2), one hit -> 1/2.
    assert sq.topk_recall(torch.tensor([[F, T, T]]), torch.tensor([[2.0, 2.0, 1.0]])) == 0.5


def test_rel_err_by_hand():
    # ref (3, 4) has norm 5; out - ref = (0, -3) has norm 3 -> 3/5.
    assert sq.rel_err(torch.tensor([[3.0, 1.0]]), torch.tensor([[3.0, 4.0]])) == pytest.approx(0.6)
    assert sq.rel_err(torch.zeros(2), torch.zeros(2)) == 0.0
    assert sq.rel_err(torch.ones(2), torch.zeros(2)) == math.inf


def test_allowed_mask_is_bottom_right():
    # 2 queries at the end of 4 keys: positions 2 and 3.
    assert torch.equal(sq.allowed_mask(2, 4, True), torch.tensor([[T, T, T, F], [T, T, T, T]]))
    assert sq.allowed_mask(2, 4, False).all()


def test_scores_and_reference_read_the_kv_head_of_each_query_head():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((1, 4, 3, 5), (1, 2, 6, 5), (1, 2, 6, 3))
    )
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    torch.testing.assert_close(sq.attention_scores(q, k), q @ kr.transpose(-2, -1), rtol=0, atol=1e-12)
    ok = sq.allowed_mask(3, 6, True)
    want = torch.softmax((q @ kr.transpose(-2, -1)).masked_fill(~ok, -math.inf), dim=-1) @ vr
    torch.testing.assert_close(sq.exact_attention(q, k, v, ok), want, rtol=0, atol=1e-12)


def test_exact_selection_scores_one_and_dense_attention_has_no_error():
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, 2, 5, 4, generator=g),
        torch.randn(1, 2, 9, 4, generator=g),
        torch.randn(1, 2, 9, 4, generator=g),
    )
    selected = attention.spec("topk_fast").selection(q, k, causal=True, topk=3)
    # Attention over the exact top-3 only: all of the top-k, part of the mass, a small error.
    quality = sq.selection_quality(q, k, v, selected, sq.exact_attention(q, k, v, selected), causal=True)
    assert quality["topk_recall"] == 1.0 and 0 < quality["mass_recall"] < 1 and 0 < quality["attn_rel_err"] < 1
    everything = sq.allowed_mask(5, 9, True).expand(1, 2, 5, 9)
    dense = sq.exact_attention(q, k, v, sq.allowed_mask(5, 9, True))
    full = sq.selection_quality(q, k, v, everything, dense, causal=True)
    assert full == {
        "mass_recall": pytest.approx(1.0),
        "topk_recall": 1.0,
        "attn_rel_err": 0.0,
        "attended_fraction": 1.0,
    }
