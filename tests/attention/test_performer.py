"""Performer: causality, agreement with the FAVOR+ estimator, convergence, random features."""

import math

import pytest
import torch

import topk_bench.attention
from attention_reference import qkv, reference_attention
from topk_bench.attention.methods.performer import causal_key_features, draw_projection, performer_attention
from topk_bench.attention.shared.causal_product import causal_product

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")


def favor_quadratic(q, k, v, projection, causal):
    """The same features, attention as an explicit L x L matrix of feature products."""
    import performer_pytorch.performer_pytorch as pp

    phi_q = pp.softmax_kernel(q * math.sqrt(q.shape[-1]), projection_matrix=projection, is_query=True)
    phi_k = causal_key_features(k, projection)
    a = phi_q @ phi_k.transpose(-2, -1)
    if causal:
        a = a.tril()
    return (a @ v) / a.sum(dim=-1, keepdim=True)


def small_qkv(lq=9, d=6, scale=0.5, seed=0):
    q, k, v = qkv(lq, lq, d=d, dv=4, seed=seed)
    with torch.no_grad():
        q.mul_(scale / math.sqrt(d))  # the caller scales q
        k.mul_(scale)
    return q, k, v


def test_causal_product_matches_masked_product_and_gradcheck():
    a, b, v = qkv(7, 7, d=3, dv=2, b=1, h=1, seed=1)
    want = (a @ b.transpose(-2, -1)).tril() @ v
    torch.testing.assert_close(causal_product(a, b, v, chunk_size=3), want, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b, v: causal_product(a, b, v, chunk_size=3), (a, b, v), fast_mode=True)


def test_causal_performer_equals_the_quadratic_estimator_with_the_same_features():
    q, k, v = small_qkv()
    torch.manual_seed(0)
    projection = draw_projection(64, q.shape[-1]).double()
    got = performer_attention(q, k, v, causal=True, projection=projection, chunk_size=4)
    want = favor_quadratic(q, k, v, projection, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # The chunk size changes nothing but rounding.
    other = performer_attention(q, k, v, causal=True, projection=projection, chunk_size=1000)
    torch.testing.assert_close(got, other, rtol=0, atol=1e-12)


def test_no_future_key_or_value_changes_an_earlier_output():
    q, k, v = small_qkv(lq=12)
    torch.manual_seed(0)
    projection = draw_projection(32, q.shape[-1]).double()
    j = 7
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[..., j:, :] *= 25.0  # large future keys: would move a sequence-wide max
    v2[..., j:, :] = -v2[..., j:, :] + 3.0
    before = performer_attention(q, k, v, causal=True, projection=projection, chunk_size=5)
    after = performer_attention(q, k2, v2, causal=True, projection=projection, chunk_size=5)
    assert torch.equal(before[..., :j, :], after[..., :j, :])
    assert not torch.allclose(before[..., j:, :], after[..., j:, :])


def test_the_package_key_map_leaks_the_future():
    # Why the causal path has its own key map: the package's subtracts a max over the
    # whole sequence (with eps), so the perturbation of the test above reaches the past.
    import performer_pytorch.performer_pytorch as pp

    q, k, v = small_qkv(lq=12)
    torch.manual_seed(0)
    projection = draw_projection(32, q.shape[-1]).double()
    k2 = k.detach().clone()
    k2[..., 7:, :] *= 25.0
    phi_q = pp.softmax_kernel(q * math.sqrt(q.shape[-1]), projection_matrix=projection, is_query=True)

    def past(keys):
        a = (phi_q @ pp.softmax_kernel(keys, projection_matrix=projection, is_query=False).transpose(-2, -1)).tril()
        return ((a @ v) / a.sum(-1, keepdim=True))[..., :7, :]

    assert not torch.allclose(past(k), past(k2))


@pytest.mark.parametrize("causal", [False, True])
def test_error_against_softmax_shrinks_with_more_features(causal):
    q, k, v = small_qkv(lq=16, d=16, scale=0.7)
    want = reference_attention(q, k, v, causal=causal)

    def error(m):
        total = 0.0
        for seed in range(3):
            torch.manual_seed(seed)
            out = performer_attention(q, k, v, causal=causal, nb_features=m, chunk_size=5)
            total += ((out - want).norm() / want.norm()).item()
        return total / 3

    # Monte-Carlo error ~ 1/sqrt(m) plus the package's eps bias: 16x the features, well under half the error.
    errors = [error(m) for m in (4, 64, 1024)]
    assert errors[1] < 0.75 * errors[0] and errors[2] < 0.5 * errors[1], errors


def test_random_features_drawn_once_per_layer_and_reproducible():
    spec = topk_bench.attention.spec("performer")
    assert spec.legend() == "Performer (features=256)" and not spec.exact
    assert spec.activations == ("softmax",) and spec.causal
    assert spec.resolve()["nb_features"] == 256
    torch.manual_seed(0)
    first = spec.module(8, nb_features=24)
    second = spec.module(8, nb_features=24)
    torch.manual_seed(0)
    again = spec.module(8, nb_features=24)
    assert first.projection.shape == (24, 8)
    assert torch.equal(first.projection, again.projection)
    assert not torch.equal(first.projection, second.projection)
    assert "projection" in dict(first.named_buffers())
    q, k, v = small_qkv(d=8)
    module = spec.module(8, nb_features=16).double()
    torch.manual_seed(1)
    out1 = module(q, k, v, causal=True)
    out2 = module(q, k, v, causal=True)  # a new call draws nothing new
    assert torch.equal(out1, out2)


def test_relu_is_refused():
    q, k, v = small_qkv()
    with pytest.raises(ValueError, match="softmax"):
        performer_attention(q, k, v, activation="relu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_layer_built_in_half_precision_draws_its_features_in_float32(dtype):
    # The CPU has no half-precision QR: a model built under a half default dtype must still get its features.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        layer = topk_bench.attention.spec("performer").module(8, nb_features=16)
    finally:
        torch.set_default_dtype(previous)
    torch.manual_seed(0)
    assert layer.projection.dtype == torch.float32
    torch.testing.assert_close(layer.projection, draw_projection(16, 8), rtol=0, atol=0)
