"""Every predictable implementation and every layer runs forward and backward under FakeTensorMode.

The harness predicts peak memory this way, so data-dependent ops (``.item()``,
``nonzero``, boolean-mask indexing, branching on values) are not allowed.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import topk_bench.attention
from topk_bench.attention import Decoder, FeedForward, MultiHeadAttention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

# Small values for the options that exist, so that chunking and top-k really happen.
SMALL = {"chunk_size": 3, "topk": 2, "nb_features": 8}
PREDICTABLE = [s.name for s in topk_bench.attention.all_specs() if s.predictable]


def small_options(spec):
    return {key: value for key, value in SMALL.items() if key in spec.options}


def cases():
    for name in PREDICTABLE:
        spec = topk_bench.attention.spec(name)
        for activation in spec.activations:
            for causal in (False, True) if spec.causal else (False,):
                yield name, activation, causal


@pytest.mark.parametrize("name,activation,causal", list(cases()))
def test_implementation_forward_backward_under_fake_tensors(name, activation, causal):
    spec = topk_bench.attention.spec(name)
    with FakeTensorMode():
        q = torch.randn(2, 3, 7, 4, requires_grad=True)
        k = torch.randn(2, 3, 8, 4, requires_grad=True)
        v = torch.randn(2, 3, 8, 4, requires_grad=True)
        out = spec.fn(q, k, v, causal=causal, activation=activation, **small_options(spec))
        out.mean().backward()
    assert isinstance(out, FakeTensor) and out.shape == (2, 3, 7, 4)
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("name", PREDICTABLE)
def test_layers_forward_backward_under_fake_tensors(name):
    spec = topk_bench.attention.spec(name)
    options = small_options(spec)
    ff_name = name if "relu" in spec.activations else "vanilla"
    ff_options = options if ff_name == name else {}
    with FakeTensorMode():
        layers = [
            MultiHeadAttention(8, 2, name, causal=spec.causal, **options),
            FeedForward(8, 12, ff_name, **ff_options),
        ]
        if spec.causal:
            layers.append(
                Decoder(
                    layers=2,
                    d_model=8,
                    heads=2,
                    d_ff=12,
                    attention=name,
                    feedforward=ff_name,
                    attention_options=options,
                    feedforward_options=ff_options,
                )
            )
        for layer in layers:
            x = torch.randn(2, 5, 8, requires_grad=True)
            layer(x).mean().backward()
            assert isinstance(x.grad, FakeTensor) and x.grad.shape == x.shape
            assert all(p.grad is not None for p in layer.parameters())


def test_all_implementations_of_this_project_are_predictable():
    for name in ("vanilla", "sdpa", "qchunk", "topk", "topk_sparse", "performer"):
        assert name in PREDICTABLE
