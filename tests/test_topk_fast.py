"""topk_fast gives topk's results (float64, 1e-10), predictably, in every layer."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import implementations
from attention_reference import assert_all_close, out_and_grads, qkv, reference_attention
from attention_reference import single_thread  # noqa: F401 (autouse fixture)
from implementations import Decoder, FeedForward, MultiHeadAttention
from implementations import topk_fast as module

fast = implementations.get("topk_fast")
paper = implementations.get("topk")

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
        (Decoder, lambda n: dict(layers=2, d_model=16, heads=2, d_ff=40, attention=n, feedforward=n,
                                 attention_options={"topk": 3, "chunk_size": 4},
                                 feedforward_options={"topk": 5, "chunk_size": 7})),
    ],
)
def test_layers_equal_topk(layer_cls, kwargs):
    got, want = _layer_outputs(layer_cls, kwargs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
