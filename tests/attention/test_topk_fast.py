"""topk_fast gives topk's results (float64, 1e-10), predictably, in every layer."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import topk_bench.attention
from attention_reference import assert_all_close, out_and_grads, qkv, qkv_gqa, reference_attention
from topk_bench.attention import Decoder, FeedForward, MultiHeadAttention
from topk_bench.attention.methods import topk_fast as module

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

fast = topk_bench.attention.get("topk_fast")
paper = topk_bench.attention.get("topk")

# Odd shapes: Lq != Lk both ways, k above some causal rows' allowed keys, k >= Lk,
# several row tiles (chunk_size < Lq) and the pruned top-k (Lk >> k).
SHAPES = [(9, 9, 3, 4), (7, 13, 4, 5), (12, 5, 2, 7), (37, 37, 40, 10), (61, 150, 4, 16), (150, 61, 3, 1000)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("lq,lk,topk,chunk", SHAPES)
def test_equals_topk_and_dense_reference(activation, causal, lq, lk, topk, chunk):
    q, k, v = qkv(lq, lk, seed=lq * lk)
    options = dict(causal=causal, activation=activation, topk=topk, chunk_size=chunk)
    got = out_and_grads(fast, q, k, v, **options)
    assert_all_close(got, out_and_grads(paper, q, k, v, **options))
    assert_all_close(got, out_and_grads(reference_attention, q, k, v, causal=causal, activation=activation, topk=topk))


def test_pruned_topk_path_is_exercised():
    # Guards SHAPES: Lk=150 and k=4 give groups of 6 keys, so the pruning really runs.
    assert module._segments(150, 4) > 1


def test_pruned_row_topk_equals_plain_topk_with_masked_ties():
    scores = torch.randn(3, 5, 96, dtype=torch.float64)
    scores[0, :, 40:] = float("-inf")  # rows with many tied -inf: any of them is a valid pick
    s = module._segments(96, 8)
    values, where = module._row_topk(scores, 8, s)
    want = scores.topk(8, dim=-1).values
    torch.testing.assert_close(values.sort(dim=-1, descending=True).values, want, rtol=0, atol=0)
    torch.testing.assert_close(scores.gather(-1, where), values, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_topk_ranks_floats_by_their_bits_exactly(dtype):
    # Negative values (flipped magnitude bits), -inf masks, both zeros and a +inf: the same
    # values as torch.topk, each at its index, and the map back is exact.
    x = torch.randn(6, 300, dtype=torch.float64).mul(40).to(dtype)
    x[:, :50] = float("-inf")
    x[0, 60], x[0, 61], x[1, 7] = -0.0, 0.0, float("inf")
    x[2] = -x[2].abs()  # a row of negatives only
    values, indices = module._topk(x, 40)
    assert values.dtype == dtype
    assert torch.equal(values.sort(dim=-1, descending=True).values, x.topk(40, dim=-1).values)
    assert torch.equal(x.gather(-1, indices), values)
    assert torch.equal(module._ordered_bits(module._ordered_bits(x)).view(dtype), x)
    assert module._ordered_bits(x).dtype.itemsize == x.element_size()


def test_half_ranked_decode_keeps_its_scores_in_the_input_dtype():
    # bf16 ranking: the step's scores (8 query rows of 2 K/V heads x 4096 keys: 128 KiB in bf16)
    # stay bf16, no float32 buffer of all scores (256 KiB) or copy of K (1 MiB).
    from live_bytes import LiveBytes

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 1, 32, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 4096, 32, generator=g).bfloat16() for _ in range(2))
    fn = topk_bench.attention.get("topk_fast")
    with torch.no_grad(), LiveBytes(q, k, v) as tracker:
        out = fn(q, k, v, causal=True, topk=256)
    scores_bf16 = 2 * 4 * 4096 * 2
    assert tracker.largest == scores_bf16, tracker.largest
    with torch.no_grad(), LiveBytes(q, k, v) as tracker:
        want = fn(q, k, v, causal=True, topk=256, float_scores=True)
    assert tracker.largest >= 2 * scores_bf16  # guards the bound: float32 ranking keeps float32 scores
    # Keys may swap only at ties within a bf16 rounding of the k-th score: outputs agree to bf16 precision.
    torch.testing.assert_close(out.float(), want.float(), rtol=0, atol=5e-2)


def test_only_some_inputs_require_grad():
    q, k, v = qkv(11, 11, seed=3)
    k = k.detach()
    out = fast(q, k, v, causal=True, topk=4, chunk_size=4)
    dq, dv = torch.autograd.grad(out.sum(), (q, v))
    want = torch.autograd.grad(paper(q, k, v, causal=True, topk=4, chunk_size=4).sum(), (q, v))
    torch.testing.assert_close(dq, want[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(dv, want[1], rtol=0, atol=1e-10)


@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_gradcheck(activation):
    q, k, v = qkv(6, 7, d=3, dv=2, b=1, h=2, seed=1)
    assert torch.autograd.gradcheck(
        lambda q, k, v: fast(q, k, v, causal=True, activation=activation, topk=3, chunk_size=4), (q, k, v)
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_forward_backward_under_fake_tensors(activation, causal):
    with FakeTensorMode():
        q = torch.randn(1, 2, 300, 8, requires_grad=True)
        k = torch.randn(1, 2, 300, 8, requires_grad=True)
        v = torch.randn(1, 2, 300, 6, requires_grad=True)
        out = fast(q, k, v, causal=causal, activation=activation, topk=4, chunk_size=64)
        out.mean().backward()
    assert out.shape == (1, 2, 300, 6) and k.grad.shape == k.shape and v.grad.shape == v.shape


def _layer_outputs(layer_cls, kwargs, seed=0):
    """Output and parameter gradients of a layer built with topk_fast, then with topk."""
    results = []
    for name in ("topk_fast", "topk"):
        torch.manual_seed(seed)
        layer = layer_cls(**kwargs(name)).double()
        x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        out = layer(x)
        out.pow(2).mean().backward()
        results.append([out] + [p.grad for p in layer.parameters()])
    return results


@pytest.mark.parametrize(
    "layer_cls,kwargs",
    [
        (MultiHeadAttention, lambda n: dict(d_model=16, heads=2, attention=n, causal=True, topk=3, chunk_size=4)),
        (FeedForward, lambda n: dict(d_model=16, d_ff=40, attention=n, topk=5, chunk_size=7)),
        (
            Decoder,
            lambda n: dict(
                layers=2,
                d_model=16,
                heads=2,
                d_ff=40,
                attention=n,
                feedforward=n,
                attention_options={"topk": 3, "chunk_size": 4},
                feedforward_options={"topk": 5, "chunk_size": 7},
            ),
        ),
    ],
)
def test_layers_equal_topk(layer_cls, kwargs):
    got, want = _layer_outputs(layer_cls, kwargs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def _padding(lk):
    pad = torch.zeros(2, lk, dtype=torch.bool)
    pad[0, [1, 4, lk - 1]] = True
    pad[1] = True  # nothing to attend: zero output and gradients, no NaN
    return pad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("lq,lk,topk,chunk", [(9, 9, 3, 4), (7, 13, 4, 5), (61, 150, 4, 16), (12, 40, 37, 5)])
def test_key_padding_mask_equals_topk(activation, causal, lq, lk, topk, chunk):
    # Includes an all-padding batch row, the pruned top-k (Lk=150) and k above the allowed keys.
    q, k, v = qkv(lq, lk, seed=lq + lk)
    pad = _padding(lk)
    options = dict(causal=causal, activation=activation, topk=topk, chunk_size=chunk, key_padding_mask=pad)
    got = out_and_grads(fast, q, k, v, **options)
    assert_all_close(got, out_and_grads(paper, q, k, v, **options))
    want = out_and_grads(
        reference_attention, q, k, v, causal=causal, activation=activation, topk=topk, key_padding_mask=pad
    )
    assert_all_close(got, want)
    assert all(t[1].abs().max() == 0 for t in (got[0], got[1], got[3]))


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv,lq,lk,topk,chunk", [(6, 2, 61, 150, 4, 16), (4, 1, 150, 150, 5, 32)])
def test_gqa_with_pruned_selection_equals_topk(hq, hkv, lq, lk, topk, chunk, causal, padding):
    # tests/attention/test_grouped_query_attention.py's shapes are too short for the pruned top-k (Lk >> k, groups
    # of
    # several keys, a remainder of columns): here each K/V head serves several query
    # heads through it, k a power of two (shifts) and not.
    q, k, v = qkv_gqa(lq, lk, hq, hkv, seed=hq * lk)
    options = dict(causal=causal, topk=topk, chunk_size=chunk, key_padding_mask=_padding(lk) if padding else None)
    got = out_and_grads(fast, q, k, v, **options)
    assert got[2].shape == k.shape and got[3].shape == v.shape
    assert_all_close(got, out_and_grads(paper, q, k, v, **options))


def test_bad_padding_and_dropout_are_refused():
    q, k, v = qkv(3, 4)
    with pytest.raises(ValueError, match="dropout"):
        fast(q, k, v, dropout=1.0)
    with pytest.raises(ValueError, match="key_padding_mask"):
        fast(q, k, v, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))


def test_dropout_draws_the_same_masks_as_topk():
    # Same seed, same draws, in the same order, as topk: with k = Lk = 1 (one slot per row)
    # the slot -> key maps agree, so the results must be the same.
    q, k, v = qkv(7, 1, seed=2)
    options = dict(causal=False, topk=1, chunk_size=3, dropout=0.5)
    results = []
    for fn in (fast, paper):
        torch.manual_seed(11)
        results.append(out_and_grads(fn, q, k, v, **options))
    assert (results[0][0] == 0).any() and (results[0][0] != 0).any()
    assert_all_close(*results)


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_dropout_matches_dense_reference_with_the_same_masks(activation, padding):
    # topk orders its k slots differently, so masks cannot match it key by key: as for topk
    # (tests/attention/test_topk.py), v = I reveals the dropped weights, and a dense reference
    # with those masks must give the same outputs and gradients (p = 0.1: 1/(1-p) inexact).
    lq, lk = 13, 40
    q, k, v = qkv(lq, lk, seed=9)
    pad = _padding(lk) if padding else None
    options = dict(activation=activation, causal=True, topk=5, chunk_size=4, key_padding_mask=pad)
    eye = torch.eye(lk, dtype=torch.float64).expand(2, 3, lk, lk)
    with torch.no_grad():
        torch.manual_seed(7)
        dropped = fast(q, k, eye, dropout=0.1, **options)
        plain = fast(q, k, eye, **options)
    scale = torch.where(plain != 0, dropped / plain, torch.zeros_like(plain))
    assert ((scale == 0) & (plain != 0)).any() and (scale.max() - 1 / 0.9).abs() < 1e-12

    def reference(q, k, v):
        return (
            scale * reference_attention(q, k, eye, activation=activation, causal=True, topk=5, key_padding_mask=pad)
        ) @ v

    torch.manual_seed(7)
    got = out_and_grads(lambda *a: fast(*a, dropout=0.1, **options), q, k, v)
    assert_all_close(got, out_and_grads(reference, q, k, v))


def test_dropout_gradients_are_right_across_chunks():
    q, k, v = qkv(7, 6, d=3, dv=2, b=1, h=2, seed=5)

    def attention(q, k, v):
        torch.manual_seed(1234)
        return fast(q, k, v, causal=True, topk=3, chunk_size=2, dropout=0.5)

    assert torch.autograd.gradcheck(attention, (q, k, v))
    assert not torch.allclose(attention(q, k, v), fast(q, k, v, causal=True, topk=3, chunk_size=2))


@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_padding_and_dropout_under_fake_tensors(activation):
    with FakeTensorMode():
        q = torch.randn(2, 2, 300, 8, requires_grad=True)
        k = torch.randn(2, 2, 300, 8, requires_grad=True)
        v = torch.randn(2, 2, 300, 6, requires_grad=True)
        pad = torch.zeros(2, 300, dtype=torch.bool)
        out = fast(
            q, k, v, causal=True, activation=activation, topk=4, chunk_size=64, key_padding_mask=pad, dropout=0.1
        )
        out.mean().backward()
    assert out.shape == (2, 2, 300, 6) and q.grad.shape == q.shape and k.grad.shape == k.shape
