"""Layers: feed-forward as attention, MHA and Decoder give the same results with every exact implementation."""

import copy

import pytest
import torch

import topk_bench.attention
from topk_bench.attention import Decoder, FeedForward, MultiHeadAttention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

TOL = dict(rtol=0, atol=1e-10)


def grads_of(module, x):
    """Output, then gradients of the input and of every parameter, for a fixed cotangent."""
    x = x.detach().clone().requires_grad_(True)
    out = module(x)
    cot = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    params = [p for _, p in sorted(module.named_parameters())]
    return [out, *torch.autograd.grad(out, [x, *params], cot)]


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, i=i: f"tensor {i}: {m}")


def test_feedforward_with_vanilla_is_relu_mlp(f64):
    torch.manual_seed(0)
    ff = FeedForward(d_model=6, d_ff=10, attention="vanilla")
    x = torch.randn(2, 5, 6)

    class Mlp(torch.nn.Module):  # relu(x W1ᵀ) W2 with W1 = keys, W2 = valuesᵀ, same parameter names
        def __init__(self):
            super().__init__()
            self.keys, self.values = ff.keys, ff.values

        def forward(self, x):
            return torch.relu(x @ self.keys.t()) @ self.values

    assert_same(grads_of(ff, x), grads_of(Mlp(), x))


@pytest.mark.parametrize(
    "name,options",
    [
        ("qchunk", {"chunk_size": 4}),
        ("topk", {"chunk_size": 3, "topk": 10}),
        ("topk_sparse", {"chunk_size": 3, "topk": 12}),
    ],
)
def test_feedforward_exact_implementations_equal_vanilla(f64, name, options):
    torch.manual_seed(0)
    want_ff = FeedForward(d_model=6, d_ff=10, attention="vanilla")
    ff = FeedForward(d_model=6, d_ff=10, attention=name, **options)
    ff.load_state_dict(want_ff.state_dict())
    x = torch.randn(2, 5, 6)
    assert_same(grads_of(ff, x), grads_of(want_ff, x))


@pytest.mark.parametrize(
    "name,options",
    [
        ("sdpa", {}),
        ("qchunk", {"chunk_size": 3}),
        ("topk", {"chunk_size": 4, "topk": 7}),
    ],
)
def test_mha_exact_implementations_equal_vanilla(f64, name, options):
    torch.manual_seed(0)
    want = MultiHeadAttention(8, 2, "vanilla", causal=True)
    got = MultiHeadAttention(8, 2, name, causal=True, **options)
    got.load_state_dict(want.state_dict())
    x = torch.randn(2, 7, 8)
    assert_same(grads_of(got, x), grads_of(want, x))


@pytest.mark.parametrize(
    "attention,feedforward,attention_options,feedforward_options",
    [
        ("qchunk", "qchunk", {"chunk_size": 3}, {"chunk_size": 5}),
        ("topk", "topk", {"chunk_size": 4, "topk": 7}, {"chunk_size": 5, "topk": 12}),
        ("topk", "qchunk", {"chunk_size": 2, "topk": 100}, {"chunk_size": 4}),
    ],
)
def test_decoder_equals_all_vanilla_with_same_weights(
    f64, attention, feedforward, attention_options, feedforward_options
):
    torch.manual_seed(0)
    shape = dict(layers=2, d_model=8, heads=2, d_ff=12)
    want = Decoder(**shape)
    got = Decoder(
        **shape,
        attention=attention,
        feedforward=feedforward,
        attention_options=attention_options,
        feedforward_options=feedforward_options,
    )
    got.load_state_dict(want.state_dict())
    x = torch.randn(2, 7, 8)
    assert_same(grads_of(got, x), grads_of(want, x))


def test_decoder_with_small_topk_differs_from_vanilla(f64):
    # Guards the equality test above: top-k with k < L really changes the decoder.
    torch.manual_seed(0)
    want = Decoder(layers=1, d_model=8, heads=2, d_ff=12)
    got = Decoder(layers=1, d_model=8, heads=2, d_ff=12, attention="topk", attention_options={"topk": 2})
    got.load_state_dict(want.state_dict())
    x = torch.randn(1, 7, 8)
    assert (got(x) - want(x)).abs().max() > 1e-6


def test_performer_layers_hold_their_own_random_features():
    torch.manual_seed(0)
    decoder = Decoder(
        layers=2, d_model=8, heads=2, d_ff=12, attention="performer", attention_options={"nb_features": 16}
    )
    first, second = (dict(b.mha.named_buffers())["attention.projection"] for b in decoder.blocks)
    assert first.shape == (16, 4) and not torch.equal(first, second)
    copied = copy.deepcopy(decoder)
    x = torch.randn(1, 5, 8)
    assert torch.equal(copied(x), decoder(x))


@pytest.mark.parametrize("name", ["vanilla", "sdpa", "qchunk", "topk", "topk_sparse", "topk_fast", "performer"])
def test_decoder_runs_in_bfloat16(name):
    # The layers hold no dtype of their own: cast to bf16, every implementation keeps it.
    spec = topk_bench.attention.spec(name)
    options = {k: v for k, v in {"chunk_size": 3, "topk": 2, "nb_features": 8}.items() if k in spec.options}
    ff = name if "relu" in spec.activations else "vanilla"
    torch.manual_seed(0)
    decoder = Decoder(
        layers=1,
        d_model=8,
        heads=2,
        d_ff=12,
        attention=name,
        feedforward=ff,
        attention_options=options,
        feedforward_options=options if ff == name else {},
    )
    decoder = decoder.to(torch.bfloat16)
    x = torch.randn(2, 5, 8, dtype=torch.bfloat16, requires_grad=True)
    out = decoder(x)
    out.float().pow(2).mean().backward()
    assert out.dtype == x.grad.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in decoder.parameters())
