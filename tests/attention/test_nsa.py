"""NSA (implementations/nsa.py) against the float64 oracle of tests/nsa_reference.py: output and gradients of
q, k, v and the gate, causal and not, odd lengths, grouped-query heads, n at least the number of blocks, a
decode step over a kept compressed cache; and its selection mask."""

import pytest
import torch

import implementations
from implementations.nsa import compress, nsa_attention, nsa_selection
from tests.attention_reference import qkv_gqa
from tests.nsa_reference import nsa_reference

# Small blocks, so that a few dozen keys hold many compression and selection blocks.
SMALL = dict(compress_block=4, compress_stride=2, select_block=8, select_blocks=4, window=6, chunk_size=16)
TOL = dict(rtol=0, atol=1e-10)


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
    state = implementations.spec("nsa").cache_state(k.detach(), v.detach(), SMALL)
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
    layer = implementations.spec("nsa").module(5, **SMALL)
    q, k, v = qkv_gqa(17, 17, 2, 2, d=5, dv=4, b=1)
    layer.double()(q, k, v, causal=True).sum().backward()
    assert {name for name, p in layer.named_parameters() if p.grad is not None} == {"gate_weight", "gate_bias"}
