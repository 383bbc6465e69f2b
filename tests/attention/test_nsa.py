"""NSA (topk_bench/attention/methods/nsa.py) against the float64 oracle of tests/nsa_reference.py: output and gradients
of
q, k, v and the gate, causal and not, odd lengths, grouped-query heads, n at least the number of blocks, a
decode step over a kept compressed cache; its selection mask; and the selection's importance scores as the
paper's Eq. 9 writes them (each compression block counted by its overlap with the selection block)."""

import pytest
import torch

import topk_bench.attention
from tests.attention_reference import qkv_gqa
from tests.nsa_reference import eq9_importance, nsa_reference, nsa_reference_selection
from topk_bench.attention.methods.nsa import compress, nsa_attention, nsa_selection

# Small blocks, so that a few dozen keys hold many compression and selection blocks.
SMALL = dict(compress_block=4, compress_stride=2, select_block=8, select_blocks=4, window=6, chunk_size=16)
TOL = dict(rtol=0, atol=1e-10)
# The paper's blocks (l = 32, d = 16, l' = 64) with fewer selected blocks and a short window, so that a few hundred
# keys leave each query a choice among many blocks.
PAPER_BLOCKS = dict(compress_block=32, compress_stride=16, select_block=64, select_blocks=4, window=16, chunk_size=16)


def _oracle(q, k, v, causal, options, gate_weight=None, gate_bias=None):
    return nsa_reference(
        q,
        k,
        v,
        causal=causal,
        l=options["compress_block"],
        d=options["compress_stride"],
        l_sel=options["select_block"],
        n=options["select_blocks"],
        w=options["window"],
        gate_weight=gate_weight,
        gate_bias=gate_bias,
    )


def _gate(d, seed=7):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(d, 3, generator=g, dtype=torch.float64).requires_grad_(True)
    bias = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_(True)
    return weight, bias


CASES = [
    # (lq, lk, hq, hkv, causal, options): the name says what each covers
    pytest.param(37, 37, 2, 2, True, SMALL, id="causal-odd"),
    pytest.param(37, 37, 2, 2, False, SMALL, id="noncausal-odd"),
    pytest.param(29, 29, 4, 2, True, SMALL, id="gqa-causal"),
    pytest.param(9, 41, 4, 1, True, SMALL, id="mqa-suffix-queries"),
    pytest.param(23, 23, 2, 2, True, {**SMALL, "select_blocks": 16}, id="n-over-blocks"),
    pytest.param(20, 13, 2, 1, True, SMALL, id="queries-before-keys"),
    pytest.param(3, 3, 2, 2, True, SMALL, id="shorter-than-a-block"),
    pytest.param(12, 330, 4, 2, True, PAPER_BLOCKS, id="paper-blocks"),
    pytest.param(31, 31, 2, 1, True, {**SMALL, "compress_block": 2}, id="l-equals-d"),
    pytest.param(31, 31, 2, 1, False, {**SMALL, "compress_block": 8, "select_block": 4}, id="l-over-l-select"),
]


@pytest.mark.parametrize("lq, lk, hq, hkv, causal, options", CASES)
def test_output_and_gradients_match_the_float64_oracle(lq, lk, hq, hkv, causal, options):
    q, k, v = qkv_gqa(lq, lk, hq, hkv, d=5, dv=4, b=2)
    weight, bias = _gate(5)
    out = nsa_attention(q, k, v, causal=causal, gate_weight=weight, gate_bias=bias, **options)
    ref = _oracle(q, k, v, causal, options, weight, bias)
    upstream = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    got = (out, *torch.autograd.grad(out, (q, k, v, weight, bias), upstream))
    want = (ref, *torch.autograd.grad(ref, (q, k, v, weight, bias), upstream))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dgate_weight", "dgate_bias"), got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_without_gates_each_branch_weighs_one_third():
    q, k, v = qkv_gqa(19, 19, 2, 2, d=5, dv=4, b=1)
    torch.testing.assert_close(nsa_attention(q, k, v, causal=True, **SMALL), _oracle(q, k, v, True, SMALL), **TOL)


@pytest.mark.parametrize("hq, hkv", [(2, 2), (4, 1)])
def test_a_decode_step_over_the_kept_compressed_cache_matches_the_oracle(hq, hkv):
    """No gradient and few query rows: the selection branch copies its blocks (the decode path), the compressed
    keys and values come kept with the cache (the registry's cache_state)."""
    q, k, v = qkv_gqa(2, 45, hq, hkv, d=5, dv=4, b=2)
    state = topk_bench.attention.spec("nsa").cache_state(k.detach(), v.detach(), SMALL)
    with torch.no_grad():
        out = nsa_attention(q, k, v, causal=True, **SMALL, **state)
        ref = _oracle(q, k, v, True, SMALL)
    torch.testing.assert_close(out, ref, **TOL)


def test_a_kept_cache_of_the_wrong_shape_is_refused():
    q, k, v = qkv_gqa(2, 45, 2, 2, d=5, dv=4, b=1)
    wrong = compress(k[:, :, :40], 4, 2)
    with pytest.raises(ValueError, match=r"compressed_k must be \[B, Hkv, nc, d\]"):
        nsa_attention(q, k, v, causal=True, compressed_k=wrong, compressed_v=compress(v, 4, 2), **SMALL)


@pytest.mark.parametrize(
    "options, message",
    [
        ({**SMALL, "compress_stride": 3}, "compress_stride \\(3\\) to divide"),
        ({**SMALL, "select_block": 7}, "compress_stride \\(2\\) to divide .* and select_block \\(7\\)"),
        ({**SMALL, "select_blocks": 2}, "select_blocks >= 3"),
        ({**SMALL, "window": -1}, "window >= 0"),
    ],
)
def test_bad_options_name_what_is_wrong(options, message):
    q, k, v = qkv_gqa(8, 8, 2, 2)
    with pytest.raises(ValueError, match=message):
        nsa_attention(q, k, v, causal=True, **options)


@pytest.mark.parametrize("causal", [True, False])
def test_selection_is_the_keys_the_selected_blocks_and_window_hold(causal):
    """The selection mask: with the compression and window branches gated off, the output is attention over
    exactly the keys the mask names (compared with a dense masked softmax)."""
    q, k, v = qkv_gqa(33, 33, 4, 2, d=5, dv=4, b=2)
    options = {**SMALL, "window": 0}
    mask = nsa_selection(q, k, causal=causal, **options)
    off = torch.tensor([-50.0, 50.0, -50.0], dtype=torch.float64)  # gates: 0, 1, 0
    out = nsa_attention(
        q, k, v, causal=causal, gate_weight=torch.zeros(5, 3, dtype=torch.float64), gate_bias=off, **options
    )
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-2, -1)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(out, weights @ v.repeat_interleave(2, dim=1), rtol=0, atol=1e-12)
    assert mask.sum(-1).max() <= options["select_blocks"] * options["select_block"]


def test_the_layer_learns_its_gate():
    layer = topk_bench.attention.spec("nsa").module(5, **SMALL)
    q, k, v = qkv_gqa(17, 17, 2, 2, d=5, dv=4, b=1)
    layer.double()(q, k, v, causal=True).sum().backward()
    assert {name for name, p in layer.named_parameters() if p.grad is not None} == {"gate_weight", "gate_bias"}


def _overlap(i, j, l, d, l_sel):  # noqa: E741 -- the paper's names
    """Keys compression block ``i`` (``i*d .. i*d + l - 1``) shares with selection block ``j``."""
    return max(0, min(i * d + l, (j + 1) * l_sel) - max(i * d, j * l_sel))


# (l, d, l'): the paper's; the small blocks of SMALL; l = d (each block once); l > l'; l' = d; l = l' = d.
BLOCKINGS = [(32, 16, 64), (4, 2, 8), (2, 2, 8), (8, 2, 4), (4, 2, 2), (6, 2, 8), (16, 16, 16)]


@pytest.mark.parametrize("l, d, l_sel", BLOCKINGS)
def test_eq9_counts_each_compression_block_by_its_overlap_with_the_selection_block(l, d, l_sel):  # noqa: E741
    """The oracle's Eq. 9 read from the blocks' key ranges: block i adds its probability (overlap / d) times."""
    nc, ns = 12, 6
    for i in range(nc):
        one_hot = [float(t == i) for t in range(nc)]
        weights = [eq9_importance(one_hot, j, l=l, d=d, l_sel=l_sel) for j in range(ns)]
        assert weights == [_overlap(i, j, l, d, l_sel) / d for j in range(ns)], (i, weights)


def test_at_the_papers_blocks_the_five_overlapping_compression_blocks_weigh_1_2_2_2_1():
    """l = 32, d = 16, l' = 64: selection block j (keys 64j .. 64j + 63) overlaps compression blocks 4j - 1 (its
    last 16 keys), 4j, 4j + 1, 4j + 2 (all 32) and 4j + 3 (its first 16)."""
    from topk_bench.attention.methods.nsa import selection_scores

    j, nc, ns = 2, 16, 5
    for i in range(nc):
        probs = torch.zeros(nc, dtype=torch.float64)
        probs[i] = 1.0
        want = {7: 1.0, 8: 2.0, 9: 2.0, 10: 2.0, 11: 1.0}.get(i, 0.0)
        assert eq9_importance(probs.tolist(), j, l=32, d=16, l_sel=64) == want
        assert selection_scores(probs, ns, 32, 16, 64)[j].item() == want


@pytest.mark.parametrize("l, d, l_sel", BLOCKINGS)
def test_the_selection_scores_are_eq9(l, d, l_sel):  # noqa: E741
    """The implementation's scores (box sums over the compression probabilities) against Eq. 9's double sum, for
    every number of visible compression blocks (the zeros past them add nothing)."""
    from topk_bench.attention.methods.nsa import n_compressed, selection_scores

    lk = 61
    nc, ns = n_compressed(lk, l, d), -(-lk // l_sel)
    probs = torch.rand(3, nc, generator=torch.Generator().manual_seed(l * 100 + l_sel), dtype=torch.float64)
    for visible in range(nc + 1):
        p = probs.clone()
        p[:, visible:] = 0
        got = selection_scores(p, ns, l, d, l_sel)
        want = [[eq9_importance(row[:visible], j, l=l, d=d, l_sel=l_sel) for j in range(ns)] for row in p.tolist()]
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "lq, lk, hq, hkv, causal, options",
    [
        pytest.param(40, 700, 4, 2, True, PAPER_BLOCKS, id="paper-blocks-causal"),
        pytest.param(40, 700, 2, 1, False, PAPER_BLOCKS, id="paper-blocks-noncausal"),
        pytest.param(45, 45, 4, 2, True, SMALL, id="small-gqa"),
        pytest.param(45, 45, 2, 2, True, {**SMALL, "compress_block": 2}, id="l-equals-d"),
    ],
)
def test_the_selected_keys_are_those_eq9_ranks_highest(lq, lk, hq, hkv, causal, options):
    """NSA's selection mask against the oracle's, key for key. Where l > d a sum counting each overlapping
    compression block once ranks some rows' blocks otherwise."""
    q, k, _ = qkv_gqa(lq, lk, hq, hkv, d=8, dv=4, b=2)
    got = nsa_selection(q, k, causal=causal, **options)
    want = nsa_reference_selection(
        q,
        k,
        causal=causal,
        l=options["compress_block"],
        d=options["compress_stride"],
        l_sel=options["select_block"],
        n=options["select_blocks"],
        w=options["window"],
    )
    assert torch.equal(got, want), f"{(got != want).any(-1).sum().item()} of {got[..., 0].numel()} rows differ"
