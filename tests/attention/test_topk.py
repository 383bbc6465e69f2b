"""Top-k attention with k smaller than the number of keys, gradcheck and dropout."""

import pytest
import torch

import topk_bench.attention
from attention_reference import assert_all_close, out_and_grads, qkv, reference_attention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("name", ["topk", "topk_sparse"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("lq,lk,topk,chunk", [(9, 9, 3, 4), (7, 13, 4, 5), (12, 5, 2, 7)])
def test_small_topk_matches_dense_masked_reference(name, activation, causal, lq, lk, topk, chunk):
    # Causal rows i < topk - 1 have fewer than topk allowed keys: masked keys must get zero weight.
    q, k, v = qkv(lq, lk, seed=lq + lk)
    fn = topk_bench.attention.get(name)
    got = out_and_grads(fn, q, k, v, causal=causal, activation=activation, topk=topk, chunk_size=chunk)
    want = out_and_grads(reference_attention, q, k, v, causal=causal, activation=activation, topk=topk)
    assert_all_close(got, want)


def test_small_topk_differs_from_full_attention():
    # Guards the test above: with k < Lk the reference is really sparser than vanilla.
    q, k, v = qkv(6, 10)
    full = reference_attention(q, k, v)
    sparse = topk_bench.attention.get("topk")(q, k, v, topk=3, chunk_size=4)
    assert (full - sparse).abs().max() > 1e-3


@pytest.mark.parametrize(
    "name,options",
    [
        ("qchunk", {"chunk_size": 2}),
        ("topk", {"chunk_size": 2, "topk": 3}),
        ("topk_sparse", {"chunk_size": 2, "topk": 3}),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_gradcheck(name, options, activation, causal):
    q, k, v = qkv(5, 6, d=3, dv=2, b=1, h=2, seed=3)
    fn = topk_bench.attention.get(name)
    assert torch.autograd.gradcheck(
        lambda q, k, v: fn(q, k, v, causal=causal, activation=activation, **options), (q, k, v)
    )


@pytest.mark.parametrize("name", ["topk", "topk_sparse"])
def test_dropout_gradients_are_right_across_chunks(name):
    # Re-seeding makes every forward draw the same masks; gradcheck then compares our
    # backward with finite differences. Replaying one RNG state for all chunks (the
    # paper's code) would use other masks in backward and fail here.
    q, k, v = qkv(7, 6, d=3, dv=2, b=1, h=2, seed=5)
    fn = topk_bench.attention.get(name)

    def attention(q, k, v):
        torch.manual_seed(1234)
        return fn(q, k, v, causal=True, topk=3, chunk_size=2, dropout=0.5)

    assert torch.autograd.gradcheck(attention, (q, k, v))
    dropped = attention(q, k, v)
    plain = fn(q, k, v, causal=True, topk=3, chunk_size=2)
    assert not torch.allclose(dropped, plain)


@pytest.mark.parametrize("name", ["topk", "topk_sparse"])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_dropout_matches_dense_reference_with_the_same_masks(name, activation):
    # Out is linear in v: with v = I the output is the dropped weight matrix itself, which
    # reveals the masks (same seed, same draws). Then a dense reference with those masks
    # must give the same outputs and gradients to 1e-10 (p = 0.1: 1/(1-p) is inexact).
    q, k, v = qkv(7, 6, seed=8)
    fn = topk_bench.attention.get(name)
    options = dict(activation=activation, causal=True, topk=3, chunk_size=3)
    eye = torch.eye(6, dtype=torch.float64).expand(2, 3, 6, 6)
    with torch.no_grad():
        torch.manual_seed(7)
        dropped = fn(q, k, eye, dropout=0.1, **options)
        plain = fn(q, k, eye, **options)
    scale = torch.where(plain != 0, dropped / plain, torch.zeros_like(plain))
    assert ((scale == 0) & (plain != 0)).any() and (scale.max() - 1 / 0.9).abs() < 1e-12

    def reference(q, k, v, **kw):
        return (scale * reference_attention(q, k, eye, activation=activation, causal=True, topk=3)) @ v

    torch.manual_seed(7)
    got = out_and_grads(lambda *a, **kw: fn(*a, dropout=0.1, **options), q, k, v)
    assert_all_close(got, out_and_grads(reference, q, k, v))


def test_dropout_out_of_range_is_refused():
    q, k, v = qkv(3, 3)
    with pytest.raises(ValueError, match="dropout"):
        topk_bench.attention.get("topk")(q, k, v, dropout=1.0)
