"""Exact implementations agree with a dense reference, outputs and gradients, in float64."""

import pytest
import torch

from attention_reference import assert_all_close, out_and_grads, qkv, reference_attention
from topk_bench import attention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

# (implementation, options making it exact); chunk sizes do not divide the lengths.
EXACT = [
    ("vanilla", {}),
    ("sdpa", {}),
    ("qchunk", {"chunk_size": 3}),
    ("qchunk", {"chunk_size": 1024}),
    ("topk", {"chunk_size": 4, "topk": 11}),
    ("topk", {"chunk_size": 5, "topk": 1000}),
    ("topk_sparse", {"chunk_size": 4, "topk": 11}),
]
SHAPES = [(7, 7), (7, 11), (10, 6)]  # (Lq, Lk): square, wide, tall


@pytest.mark.parametrize("lq,lk", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("name,options", EXACT, ids=lambda x: str(x))
def test_exact_implementation_matches_reference(name, options, activation, causal, lq, lk):
    if activation not in attention.spec(name).activations:
        pytest.skip(f"{name} does not support {activation}")
    q, k, v = qkv(lq, lk)
    got = out_and_grads(attention.get(name), q, k, v, causal=causal, activation=activation, **options)
    want = out_and_grads(reference_attention, q, k, v, causal=causal, activation=activation)
    assert_all_close(got, want)


@pytest.mark.parametrize("name", ["vanilla", "qchunk", "topk", "topk_sparse"])
def test_key_padding_mask_including_an_all_padding_row(name):
    q, k, v = qkv(6, 9)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, [1, 4, 8]] = True
    pad[1] = True  # nothing to attend: zero output and gradients, no NaN
    options = {"chunk_size": 4} if name != "vanilla" else {}
    for causal in (False, True):
        got = out_and_grads(attention.get(name), q, k, v, causal=causal, key_padding_mask=pad, **options)
        want = out_and_grads(reference_attention, q, k, v, causal=causal, key_padding_mask=pad)
        assert_all_close(got, want)
        assert got[0][1].abs().max() == 0


def test_registered_implementations_describe_themselves():
    expected = {
        "qchunk": ("Q-chunking (size=1024)", {"chunk_size": 1024}),
        "topk": ("Top-k (size=1024, topk=128)", {"chunk_size": 1024, "topk": 128}),
        "topk_sparse": ("Top-k sparse (size=1024, topk=128)", {"chunk_size": 1024, "topk": 128}),
    }
    for name, (legend, defaults) in expected.items():
        spec = attention.spec(name)
        assert spec.legend() == legend
        assert defaults.items() <= spec.resolve().items()
        assert spec.causal and set(spec.activations) == {"softmax", "relu"}
    assert attention.spec("qchunk").exact
    assert not attention.spec("topk").exact and not attention.spec("topk_sparse").exact
    assert attention.spec("topk").legend({"topk": 64, "chunk_size": 512}) == "Top-k (size=512, topk=64)"


@pytest.mark.parametrize("name", ["qchunk", "topk", "topk_sparse"])
def test_bad_options_are_refused(name):
    q, k, v = qkv(3, 3)
    fn = attention.get(name)
    with pytest.raises(ValueError, match="chunk_size"):
        fn(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match="activation"):
        fn(q, k, v, activation="gelu")
    with pytest.raises(ValueError, match="leading dims"):
        fn(q, k[:1], v[:1])
