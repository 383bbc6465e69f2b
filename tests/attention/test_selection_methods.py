"""Selection methods (page_topk, sink_window, block_topk, exact top-k): float64 against a dense masked reference.

The reference here is deliberately naive and independent of the implementations:
per-row Python loops pick the keys each method's published description names, and
a dense softmax over exactly those keys gives the output. Conventions: bottom-right
causal alignment (query ``i`` at ``Lk - Lq + i``), grouped-query heads read kv head
``h // (Hq // Hkv)``.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import topk_bench.attention
from live_bytes import LiveBytes
from topk_bench.attention.methods.block_topk import block_means
from topk_bench.attention.methods.page_topk import page_bounds, page_summaries
from topk_bench.attention.shared import block_attention
from topk_bench.attention.shared import selection as core
from topk_bench.attention.shared.masking import fold_groups, unfold_groups

pytestmark = pytest.mark.usefixtures("single_thread")

TOL = dict(rtol=0, atol=1e-10)
METHODS = {
    # name: options giving a real selection at the test shapes (budgets well below Lk)
    "page_topk": {"page_size": 3, "token_budget": 6, "chunk_size": 2},
    "block_topk": {"block_size": 3, "topk_blocks": 2, "chunk_size": 2},
    "sink_window": {"sinks": 2, "window": 4},
    "topk_fast": {"topk": 4, "chunk_size": 3},
}
# (B, Hq, Hkv, Lq, Lk): square, GQA, decode (Lq = 1..4 at the end of the cache), partial last page, tall.
SHAPES = [
    (2, 2, 2, 7, 7),
    (1, 4, 2, 9, 9),
    (2, 4, 1, 1, 13),
    (1, 6, 3, 2, 14),
    (1, 4, 2, 3, 16),
    (1, 4, 2, 4, 17),
    (1, 2, 1, 8, 5),
]
shape_ids = [f"B{b}Hq{hq}Hkv{hkv}Lq{lq}Lk{lk}" for b, hq, hkv, lq, lk in SHAPES]


def inputs(b, hq, hkv, lq, lk, d=5, dv=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, lq, d, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(b, hkv, lk, d, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(b, hkv, lk, dv, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


# ----------------------------------------------------------------------------- naive references


def allowed(lq, lk, causal):
    """Bool [Lq, Lk], by the convention's words: key j for query i iff j <= Lk - Lq + i (when causal)."""
    out = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        for i in range(lq):
            for j in range(lk):
                out[i, j] = j <= lk - lq + i
    return out


def dense_masked(q, k, v, selected):
    """Softmax attention over the ``selected`` keys only (``[B, Hq, Lq, Lk]``); K/V repeated per query head."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = (q @ k.transpose(-2, -1)).masked_fill(~selected, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
    return weights @ v


def per_row(q, k, causal, pick):
    """Selection built row by row: ``pick(qrow, keys, pos, allowed_row)`` -> list of key indices.

    ``qrow``: the row's query, or, for a pick that declares ``group=True``, the queries of
    all heads of its kv head's group at that position (``[G, d]``).
    """
    b, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    ok = allowed(lq, lk, causal)
    out = torch.zeros(b, hq, lq, lk, dtype=torch.bool)
    for bi in range(b):
        for h in range(hq):
            keys = k[bi, h // g].detach()
            for i in range(lq):
                qrow = q[bi, h // g * g : h // g * g + g, i] if getattr(pick, "group", False) else q[bi, h, i]
                for j in pick(qrow.detach(), keys, lk - lq + i, ok[i]):
                    out[bi, h, i, j] = bool(ok[i, j])
    return out


def naive_blocks(q, k, causal, size, n_top, score, group=False):
    """Own block plus the ``n_top`` best-scoring eligible blocks (other blocks; earlier ones when causal).

    ``group``: the heads of a kv head's group rank blocks together, by the largest of their scores.
    """

    def pick(qrow, keys, pos, ok_row):
        lk = keys.shape[0]
        blocks = [list(range(s, min(s + size, lk))) for s in range(0, lk, size)]
        if causal and pos < 0:
            return []
        own = max(pos, 0) // size
        eligible = [p for p in range(len(blocks)) if (p < own if causal else p != own)]

        def rank(p):
            if group:
                return -max(float(score(row, keys[blocks[p]])) for row in qrow)
            return -float(score(qrow, keys[blocks[p]]))

        ranked = sorted(eligible, key=rank)
        return [j for p in ranked[:n_top] + [own] for j in blocks[p]]

    pick.group = group
    return per_row(q, k, causal, pick)


def quest_bound(qrow, page_keys):
    """sum_d max(q_d * min_d, q_d * max_d), term by term."""
    mn, mx = page_keys.min(dim=0).values, page_keys.max(dim=0).values
    return torch.maximum(qrow * mn, qrow * mx).sum()


def naive_selection(name, q, k, causal, options):
    if name == "page_topk":
        size = options["page_size"]
        return naive_blocks(
            q, k, causal, size, options["token_budget"] // size, quest_bound, group=options.get("group_pages", True)
        )
    if name == "block_topk":
        return naive_blocks(
            q, k, causal, options["block_size"], options["topk_blocks"], lambda qrow, keys: qrow @ keys.mean(dim=0)
        )
    if name == "sink_window":
        s, w = options["sinks"], options["window"]
        return per_row(
            q,
            k,
            causal,
            lambda qrow, keys, pos, ok_row: [j for j in range(keys.shape[0]) if j < s or pos - w < j <= pos],
        )
    # exact top-k: the k largest scores among the allowed keys

    def top(qrow, keys, pos, ok_row):
        cand = [j for j in range(keys.shape[0]) if ok_row[j]]
        return sorted(cand, key=lambda j: -float(qrow @ keys[j]))[: options["topk"]]

    return per_row(q, k, causal, top)


def out_and_grads(fn, q, k, v, **kw):
    out = fn(q, k, v, **kw)
    g = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    return (out, *torch.autograd.grad(out, (q, k, v), g))


def assert_close_all(got, want):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("shape", SHAPES, ids=shape_ids)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(METHODS))
def test_selection_is_the_published_rule(name, causal, shape):
    q, k, _ = inputs(*shape, seed=sum(shape))
    options = METHODS[name]
    got = topk_bench.attention.spec(name).selection(q, k, causal=causal, **options)
    assert got.dtype == torch.bool and got.shape == q.shape[:3] + (k.shape[2],)
    assert torch.equal(got, naive_selection(name, q, k, causal, options))


@pytest.mark.parametrize(
    "shape", [s for s in SHAPES if s[1] != s[2]], ids=[i for s, i in zip(SHAPES, shape_ids) if s[1] != s[2]]
)
@pytest.mark.parametrize("causal", [False, True])
def test_page_topk_per_query_head_is_quest_for_each_head(causal, shape):
    q, k, _ = inputs(*shape, seed=sum(shape))
    options = dict(METHODS["page_topk"], group_pages=False)
    got = topk_bench.attention.spec("page_topk").selection(q, k, causal=causal, **options)
    want = naive_selection("page_topk", q, k, causal, options)
    assert torch.equal(got, want)


def test_the_heads_of_a_group_share_pages_only_when_asked():
    q, k, _ = inputs(1, 8, 2, 2, 40, seed=3)
    page = topk_bench.attention.spec("page_topk").selection
    shared = page(q, k, page_size=4, token_budget=8)
    own = page(q, k, page_size=4, token_budget=8, group_pages=False)
    grouped = shared.view(1, 2, 4, 2, 40)
    assert torch.equal(grouped, grouped[:, :, :1].expand_as(grouped))  # one selection per group
    assert not torch.equal(shared, own)  # the heads' own bounds differ
    assert (shared.sum(-1) == own.sum(-1)).all()  # with the same budget


@pytest.mark.parametrize("shape", SHAPES, ids=shape_ids)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["page_topk", "block_topk", "sink_window"])
def test_attention_is_dense_softmax_over_the_selection(name, causal, shape):
    # Outputs and gradients: the selection is held fixed (MoBA's gate is not differentiated).
    q, k, v = inputs(*shape, seed=sum(shape))
    spec = topk_bench.attention.spec(name)
    options = METHODS[name]
    selected = spec.selection(q, k, causal=causal, **options)
    got = out_and_grads(spec.fn, q, k, v, causal=causal, **options)
    assert_close_all(got, out_and_grads(dense_masked, q, k, v, selected=selected))


@pytest.mark.parametrize("gather_bytes", [1, 1 << 20])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_ids)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "name, options",
    [("page_topk", {}), ("page_topk", {"group_pages": False}), ("block_topk", {})],
    ids=["page-group", "page-head", "block"],
)
def test_a_step_without_gradients_is_dense_softmax_over_the_selection(
    name, options, causal, shape, gather_bytes, monkeypatch
):
    # The decode path (copied blocks, dense products), in parts of one table row and of all rows;
    # shapes with Lk below the block size or Lq above Lk take the sampled products instead.
    monkeypatch.setattr(block_attention, "GATHER_BYTES", gather_bytes)
    q, k, v = inputs(*shape, seed=sum(shape))
    opts = dict(METHODS[name], **options)
    spec = topk_bench.attention.spec(name)
    with torch.no_grad():
        got = spec.fn(q, k, v, causal=causal, **opts)
        want = dense_masked(q, k, v, spec.selection(q, k, causal=causal, **opts))
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("name", ["page_topk", "block_topk"])
def test_a_step_takes_queries_in_any_layout(name):
    # Queries as a projection leaves them ([B, L, H, d] transposed): the decode path must not need a view.
    q, k, v = inputs(1, 4, 2, 3, 20, seed=4)
    q = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
    assert not q.is_contiguous()
    fn = topk_bench.attention.get(name)
    with torch.no_grad():
        torch.testing.assert_close(
            fn(q, k, v, causal=True, **METHODS[name]),
            fn(q.contiguous(), k, v, causal=True, **METHODS[name]),
            rtol=0,
            atol=0,
        )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["topk", "topk_sparse", "topk_fast"])
def test_exact_topk_attention_is_dense_softmax_over_its_selection(name, causal):
    # Lq == Lk when causal: the top-k entries' own causal alignment is outside this module.
    shape = (2, 3, 3, 8, 8) if causal else (2, 3, 3, 5, 11)
    q, k, v = inputs(*shape, seed=3)
    spec = topk_bench.attention.spec(name)
    assert getattr(spec.selection, "func", spec.selection) is core.topk_selection
    options = {"topk": 3, "chunk_size": 3}
    selected = spec.selection(q, k, causal=causal, **options)
    # min(k, allowed keys) per row
    assert torch.equal(selected.sum(dim=-1), allowed(shape[3], shape[4], causal).sum(-1).clamp(max=3).expand(2, 3, -1))
    got = out_and_grads(spec.fn, q, k, v, causal=causal, **options)
    assert_close_all(got, out_and_grads(dense_masked, q, k, v, selected=selected))


def test_topk_selection_honours_key_padding():
    q, k, _ = inputs(2, 2, 2, 4, 9, seed=4)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, [0, 3, 4, 5, 6, 7]] = True
    got = core.topk_selection(q, k, causal=False, topk=4, key_padding_mask=pad)
    assert not got[0, ..., pad[0]].any() and torch.equal(got[0].sum(-1), torch.full((2, 4), 3))
    assert torch.equal(got[1], core.topk_selection(q, k, causal=False, topk=4)[1])


FULL = {
    "page_topk": {"page_size": 4, "token_budget": 64},
    "block_topk": {"block_size": 3, "topk_blocks": 64},
    "sink_window": {"sinks": 0, "window": 64},
}


@pytest.mark.parametrize("shape", SHAPES, ids=shape_ids)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(FULL))
def test_a_budget_covering_the_cache_is_exact_attention(name, causal, shape):
    q, k, v = inputs(*shape, seed=7)
    # StreamingLLM's window ends at the query: the whole cache is causal attention either way.
    ok = allowed(shape[3], shape[4], causal or name == "sink_window").expand(*q.shape[:3], shape[4])
    got = out_and_grads(topk_bench.attention.get(name), q, k, v, causal=causal, **FULL[name])
    assert_close_all(got, out_and_grads(dense_masked, q, k, v, selected=ok))


@pytest.mark.parametrize("heads", [(4, 2, {"group_pages": False}), (4, 4, {})], ids=["gqa-per-head", "mha"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq", [1, 3, 12])
def test_page_size_one_selects_the_top_budget_keys_plus_the_current_token(lq, causal, heads):
    # Exact top-k per query head: with a page per head's own ranking (any heads; by default, MHA).
    hq, hkv, options = heads
    b, lk, budget = 1, 12, 3
    q, k, _ = inputs(b, hq, hkv, lq, lk, seed=lq)
    got = topk_bench.attention.spec("page_topk").selection(
        q, k, causal=causal, page_size=1, token_budget=budget, **options
    )
    scores = q.detach() @ k.detach().repeat_interleave(hq // hkv, dim=1).transpose(-2, -1)
    for i in range(lq):
        pos = lk - lq + i
        others = [j for j in range(lk) if j != pos and (j < pos or not causal)]
        for h in range(hq):
            top = sorted(others, key=lambda j: -float(scores[0, h, i, j]))[:budget]
            want = torch.zeros(lk, dtype=torch.bool)
            want[top + [pos]] = True
            assert torch.equal(got[0, h, i], want), (h, i)


@pytest.mark.parametrize("name", ["page_topk", "block_topk", "sink_window"])
def test_grouped_query_heads_equal_repeated_kv(name):
    q, k, v = inputs(2, 6, 2, 4, 15, seed=11)
    # page_topk per query head: repeated K/V makes every head its own group.
    options = dict(METHODS[name], group_pages=False) if name == "page_topk" else METHODS[name]
    fn = topk_bench.attention.get(name)
    got = out_and_grads(fn, q, k, v, causal=True, **options)
    kr = k.detach().repeat_interleave(3, dim=1).requires_grad_()
    vr = v.detach().repeat_interleave(3, dim=1).requires_grad_()
    out, dq, dkr, dvr = out_and_grads(fn, q, kr, vr, causal=True, **options)
    # The gradient of a repeated kv head is the sum over its group.
    want = (out, dq, dkr.unflatten(1, (2, 3)).sum(2), dvr.unflatten(1, (2, 3)).sum(2))
    assert_close_all(got, want)
    assert topk_bench.attention.spec(name).gqa == "native"


@pytest.mark.parametrize("name", ["page_topk", "block_topk", "sink_window"])
def test_rows_before_the_first_key_give_zeros(name):
    q, k, v = inputs(1, 2, 1, 9, 4, seed=5)  # causal, Lq > Lk: rows 0..4 sit before key 0
    out, dq, dk, dv = out_and_grads(topk_bench.attention.get(name), q, k, v, causal=True, **METHODS[name])
    assert torch.isfinite(out).all() and torch.isfinite(dq).all()
    assert out[:, :, :5].abs().max() == 0 and out[:, :, 5:].abs().min() > 0


def test_page_bounds_bound_every_key_of_the_page():
    q, k, _ = inputs(1, 4, 2, 6, 22, seed=2)
    q, k = q.detach(), k.detach()
    s = page_summaries(k, 5)
    assert s.shape == (1, 2, 5, 2, 5)
    torch.testing.assert_close(s[:, :, -1, 0], k[:, :, 20:].amin(dim=2), rtol=0, atol=0)  # partial last page
    bounds = unfold_groups(page_bounds(fold_groups(q, 2), s), 2)  # [1, 4, 6, 5]
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-2, -1)
    for p in range(5):
        page = slice(5 * p, min(5 * p + 5, 22))
        assert (bounds[..., p] >= scores[..., page].amax(dim=-1) - 1e-12).all()
        for h in range(4):
            for i in range(6):
                want = quest_bound(q[0, h, i], k[0, h // 2, page])
                torch.testing.assert_close(bounds[0, h, i, p], want, **TOL)


@pytest.mark.parametrize(
    "name, size, state, build",
    [("page_topk", "page_size", "summaries", page_summaries), ("block_topk", "block_size", "means", block_means)],
)
def test_state_kept_with_the_cache_gives_the_same_result_and_is_checked(name, size, state, build):
    # What a decode step takes from its cache (page summaries, block means) instead of reading K again.
    q, k, v = inputs(1, 4, 2, 2, 21, seed=9)
    fn = topk_bench.attention.get(name)
    options = {size: 4, "token_budget": 8} if name == "page_topk" else {size: 4, "topk_blocks": 2}
    want = fn(q, k, v, causal=True, **options)
    got = fn(q, k, v, causal=True, **{state: build(k, 4)}, **options)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match=state):
        fn(q, k, v, causal=True, **{state: build(k, 3)}, **options)


@pytest.mark.parametrize("name", ["page_topk", "block_topk", "sink_window"])
def test_refuses_relu_and_bad_options(name):
    q, k, v = inputs(1, 2, 1, 3, 6)
    fn = topk_bench.attention.get(name)
    with pytest.raises(ValueError, match="softmax"):
        fn(q, k, v, activation="relu")
    bad = {"page_topk": {"page_size": 0}, "block_topk": {"block_size": 0}, "sink_window": {"window": -1}}[name]
    with pytest.raises(ValueError):
        fn(q, k, v, **bad)
    with pytest.raises(ValueError, match="multiple"):
        fn(q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1))  # Hq = 2 query heads, Hkv = 3


@pytest.mark.parametrize("name", ["page_topk", "block_topk", "sink_window"])
def test_forward_and_backward_under_fake_tensors(name):
    with FakeTensorMode():
        q, k, v = inputs(2, 4, 2, 6, 11, dtype=torch.float32)
        out = topk_bench.attention.get(name)(q, k, v, causal=True, **METHODS[name])
        out.sum().backward()
        sel = topk_bench.attention.spec(name).selection(q, k, causal=True, **METHODS[name])
    assert isinstance(out, FakeTensor) and out.shape == (2, 4, 6, 4)
    assert k.grad.shape == k.shape and v.grad.shape == v.shape and q.grad.shape == q.shape
    assert sel.shape == (2, 4, 6, 11)
    assert topk_bench.attention.spec(name).predictable


def test_block_topk_keeps_no_lq_by_lk_tensor():
    # Fake tensors: the allocations of a real run at L = 2048 without the compute.
    b, h, length, d = 1, 2, 2048, 16
    options = {"block_size": 64, "topk_blocks": 3, "chunk_size": 128}
    with FakeTensorMode():
        q, k, v = inputs(b, h, h, length, length, d=d, dv=d, dtype=torch.float32)
        with LiveBytes(q, k, v) as tracker:
            topk_bench.attention.get("block_topk")(q, k, v, causal=True, **options).sum().backward()
    square = b * h * length * length * 4
    assert tracker.largest < square / 16, tracker.largest
    assert tracker.peak < square / 4, tracker.peak


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["page_topk", "block_topk", "sink_window", "topk_fast"])
def test_half_precision_runs_and_selects_as_float32(name, dtype):
    shape = (1, 4, 2, 3, 40) if name != "topk_fast" else (1, 2, 2, 3, 40)
    q, k, v = (t.detach().to(dtype) for t in inputs(*shape, seed=1, dtype=torch.float32))
    spec = topk_bench.attention.spec(name)
    options = {**METHODS[name], "chunk_size": 2} if "chunk_size" in METHODS[name] else METHODS[name]
    out = spec.fn(q, k, v, causal=True, **options)
    assert out.dtype == dtype and torch.isfinite(out).all()
    # Selection scores are float32: the same keys as float32 on the same (rounded) values.
    q32, k32, v32 = q.float(), k.float(), v.float()
    assert torch.equal(spec.selection(q, k, causal=True, **options), spec.selection(q32, k32, causal=True, **options))
    torch.testing.assert_close(out.float(), spec.fn(q32, k32, v32, causal=True, **options), rtol=0, atol=3e-2)


@pytest.mark.parametrize("lq", [1, 3, 70], ids=["decode", "decode-3", "training-path"])
def test_topk_fast_ranks_the_half_products_themselves(lq):
    # By default (float_scores=False) keys are ranked by the bf16 product, as dense bf16 attention rounds
    # its scores; float_scores=True ranks by float32 scores, as topk.
    q, k, v = (t.detach().to(torch.bfloat16) for t in inputs(1, 8, 2, lq, 300, d=16, dv=8, seed=5, dtype=torch.float32))
    spec, kk = topk_bench.attention.spec("topk_fast"), 40
    with torch.no_grad():
        chosen = spec.selection(q, k, causal=True, topk=kk)
        exact = spec.selection(q, k, causal=True, topk=kk, float_scores=True)
        out = spec.fn(q, k, v, causal=True, topk=kk)
        float32_ranked = spec.fn(q, k, v, causal=True, topk=kk, float_scores=True)
        products = (q @ k.repeat_interleave(4, dim=1).transpose(-2, -1)).float()  # rounded to bf16
    assert torch.equal(
        chosen, topk_bench.attention.spec("topk").selection(q, k, causal=True, topk=kk, float_scores=False)
    )
    assert torch.equal(exact, topk_bench.attention.spec("topk").selection(q, k, causal=True, topk=kk))
    ok = allowed(lq, 300, True)
    worst_chosen = products.masked_fill(~chosen, float("inf")).amin(-1)
    best_left = products.masked_fill(chosen | ~ok, float("-inf")).amax(-1)
    assert (worst_chosen >= best_left).all()  # the top of the rounded products
    assert not torch.equal(chosen, exact)  # rounding ties and swaps do change some picks
    assert (chosen & exact).sum() >= 0.95 * exact.sum()  # ... at the boundary only
    # Softmax over the rounded scores of the chosen keys (the weights come from the same rounded values).
    weights = torch.softmax(products.double().masked_fill(~chosen, float("-inf")), dim=-1)
    torch.testing.assert_close(out.double(), weights @ v.double().repeat_interleave(4, dim=1), rtol=0, atol=2e-2)
    # float32 ranking: softmax over the float32 scores of the float32 top-k
    scores = q.double() @ k.double().repeat_interleave(4, dim=1).transpose(-2, -1)
    weights = torch.softmax(scores.masked_fill(~exact, float("-inf")), dim=-1)
    torch.testing.assert_close(
        float32_ranked.double(), weights @ v.double().repeat_interleave(4, dim=1), rtol=0, atol=2e-2
    )
    # float32 inputs: the option changes nothing
    q32, k32, v32 = q.float(), k.float(), v.float()
    assert torch.equal(
        spec.fn(q32, k32, v32, causal=True, topk=kk, float_scores=True), spec.fn(q32, k32, v32, causal=True, topk=kk)
    )


def test_half_precision_backward_of_block_topk():
    q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in inputs(1, 4, 2, 6, 20, dtype=torch.float32))
    options = METHODS["block_topk"]
    got = out_and_grads(topk_bench.attention.get("block_topk"), q, k, v, causal=True, **options)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    want = out_and_grads(topk_bench.attention.get("block_topk"), q32, k32, v32, causal=True, **options)
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b, rtol=0, atol=5e-2)


def test_registry_entries_describe_selection_methods():
    for name in ("page_topk", "block_topk", "sink_window"):
        spec = topk_bench.attention.spec(name)
        assert spec.selection is not None and spec.gqa == "native" and not spec.exact
        assert spec.activations == ("softmax",) and spec.predictable
    for name in ("topk", "topk_sparse"):
        assert topk_bench.attention.spec(name).selection is core.topk_selection
    fast = topk_bench.attention.spec("topk_fast").selection  # ranked as topk_fast ranks half inputs by default
    assert fast.func is core.topk_selection and fast.keywords == {"float_scores": False}
    assert topk_bench.attention.spec("topk_fast").options["float_scores"] is False
    assert topk_bench.attention.spec("page_topk").legend() == "Page top-k (page=16, budget=1024)"
    assert topk_bench.attention.spec("block_topk").legend({"topk_blocks": 2}) == "Block top-k (block=512, top-2)"
    assert topk_bench.attention.spec("sink_window").legend() == "Sinks + window (sinks=4, window=1024)"
