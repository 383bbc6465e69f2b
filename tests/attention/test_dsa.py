"""DeepSeek Sparse Attention (topk_bench/attention/methods/dsa.py) against the naive float64 oracle
(attention_reference.reference_dsa): outputs, q/k/v gradients, the indexer loss and its
gradients, odd lengths, causal (bottom-right), grouped-query heads, topk >= keys; the decode
path with cached indexer keys; chunking changes nothing; stages are marked."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import topk_bench.attention
from attention_reference import qkv_gqa, reference_dsa
from topk_bench.attention.methods.dsa import dsa_attention, dsa_selection, index_keys, indexer_weights
from topk_bench.attention.shared import stages

pytestmark = pytest.mark.usefixtures("single_thread")

# 16 indexer heads: an indexer score is 0 (every head's ReLU off) with odds 2^-16, so no ties at the boundary.
D, HEADS, DIM = 5, 16, 4
TOL = dict(rtol=0, atol=1e-10)


def _weights(seed=1):
    return tuple(w.double().requires_grad_() for w in indexer_weights(D, HEADS, DIM, seed))


def _grad_out(out):
    return torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)


SHAPES = [(7, 7), (5, 9), (1, 9), (9, 4)]  # square, wide (a cache), one new token, tall (no key for some rows)
HEADS_KV = [(2, 2), (6, 3), (4, 1)]  # multi-head, grouped, multi-query
TOPKS = [3, 100]  # below the keys; at least every key (exact attention over the allowed keys)


@pytest.mark.parametrize("lq,lk", SHAPES)
@pytest.mark.parametrize("hq,hkv", HEADS_KV)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("topk", TOPKS)
def test_output_and_gradients_match_the_oracle(lq, lk, hq, hkv, causal, topk):
    q, k, v = qkv_gqa(lq, lk, hq, hkv, d=D, dv=4, b=1, seed=lq * 31 + lk)
    w = _weights()
    got = dsa_attention(
        q, k, v, causal=causal, topk=topk, indexer=w, chunk_size=3, index_heads=HEADS, index_head_dim=DIM
    )
    want, _ = reference_dsa(q, k, v, *w, topk=topk, causal=causal)
    g = _grad_out(want)
    got_grads = torch.autograd.grad(got, (q, k, v), g)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (got, *got_grads), (want, *want_grads)):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("hq,hkv", [(6, 3), (2, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_indexer_loss_and_its_gradients_match_the_oracle(hq, hkv, causal):
    q, k, v = qkv_gqa(6, 8, hq, hkv, d=D, dv=4, b=2, seed=3)
    w = _weights()
    weight = 0.7
    losses: list[torch.Tensor] = []
    got = dsa_attention(
        q,
        k,
        v,
        causal=causal,
        topk=3,
        indexer=w,
        chunk_size=4,
        index_heads=HEADS,
        index_head_dim=DIM,
        indexer_loss=weight,
        loss_out=losses,
    )
    want, want_loss = reference_dsa(q, k, v, *w, topk=3, causal=causal)
    torch.testing.assert_close(losses[0], want_loss.detach(), **TOL)
    g = _grad_out(want)
    got_grads = torch.autograd.grad(got, (q, k, v, *w), g)
    want_grads = torch.autograd.grad((want * g).sum() + weight * want_loss, (q, k, v, *w))
    for name, a, b in zip(("dq", "dk", "dv", "dwq", "dwk", "dww"), got_grads, want_grads):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")
    assert want_loss > 0  # the indexer's choice is not the attention's: a loss that can fail


def test_the_indexer_gets_no_gradient_without_its_loss():
    q, k, v = qkv_gqa(6, 8, 4, 2, d=D, dv=4, seed=4)
    w = _weights()
    out = dsa_attention(q, k, v, topk=3, indexer=w, chunk_size=4, index_heads=HEADS, index_head_dim=DIM)
    out.sum().backward()
    assert all(x.grad is None for x in w)
    assert q.grad is not None and k.grad is not None


def test_chunk_size_changes_nothing():
    q, k, v = qkv_gqa(11, 11, 4, 2, d=D, dv=4, seed=5)
    opts = dict(causal=True, topk=4, index_heads=HEADS, index_head_dim=DIM, seed=2)
    whole = dsa_attention(q, k, v, chunk_size=11, **opts)
    for chunk in (1, 3, 4):
        torch.testing.assert_close(dsa_attention(q, k, v, chunk_size=chunk, **opts), whole, **TOL)


def test_decode_with_cached_indexer_keys_equals_the_full_call():
    """A decode step (no gradient, one new token at the end of a cache) with the cache's indexer keys kept."""
    q, k, v = qkv_gqa(9, 9, 4, 2, d=D, dv=4, seed=6)
    opts = dict(causal=True, topk=4, index_heads=HEADS, index_head_dim=DIM, seed=2, chunk_size=3)
    full = dsa_attention(q, k, v, **opts)
    _, wk, _ = indexer_weights(D, HEADS, DIM, 2, dtype=torch.float64)
    keys = index_keys(k, wk)
    with torch.no_grad():
        step = dsa_attention(q[:, :, -1:], k, v, index_keys=keys, **opts)
    torch.testing.assert_close(step, full[:, :, -1:].detach(), **TOL)
    with pytest.raises(ValueError, match="index_keys must be"):
        dsa_attention(q, k, v, index_keys=keys[:, :, :3], **opts)


def test_cache_state_keeps_the_indexer_keys_the_step_uses():
    spec = topk_bench.attention.spec("dsa")
    k = torch.randn(1, 2, 10, 8)
    options = spec.resolve({"index_heads": 2, "index_head_dim": 4})
    state = spec.cache_state(k, k, options)
    assert state["index_keys"].shape == (1, 2, 10, 4)
    module = spec.module(8, index_heads=2, index_head_dim=4)
    torch.testing.assert_close(state["index_keys"], k @ module.wk.detach())


def test_selection_is_what_the_attention_attends():
    q, k, v = qkv_gqa(7, 9, 4, 2, d=D, dv=4, seed=7)
    opts = dict(topk=4, index_heads=HEADS, index_head_dim=DIM, seed=2, chunk_size=3)
    for causal in (False, True):
        chosen = dsa_selection(q, k, causal=causal, **opts)
        allowed = torch.ones(7, 9, dtype=torch.bool).tril(9 - 7) if causal else torch.ones(7, 9, dtype=torch.bool)
        assert (chosen.sum(-1) == allowed.sum(-1).clamp_max(4)).all()
        assert not (chosen & ~allowed).any()
        # Heads of a group share one selection.
        assert torch.equal(chosen[:, 0], chosen[:, 1]) and torch.equal(chosen[:, 2], chosen[:, 3])
        # Attending densely over exactly those keys is DSA's output.
        scores = (q @ k.repeat_interleave(2, dim=1).transpose(-2, -1)).masked_fill(~chosen, float("-inf"))
        dense = torch.softmax(scores, -1) @ v.repeat_interleave(2, dim=1)
        torch.testing.assert_close(dsa_attention(q, k, v, causal=causal, **opts), dense, **TOL)


@pytest.mark.parametrize(
    "options,match",
    [({"topk": 0}, "topk"), ({"chunk_size": 0}, "chunk_size"), ({"indexer_loss": -1.0}, "indexer_loss")],
)
def test_bad_options_say_which(options, match):
    q, k, v = qkv_gqa(3, 3, 2, 2, d=D, dv=4)
    with pytest.raises(ValueError, match=match):
        dsa_attention(q, k, v, **options)


def test_relu_activation_is_refused():
    q, k, v = qkv_gqa(3, 3, 2, 2, d=D, dv=4)
    with pytest.raises(ValueError, match="relu"):
        dsa_attention(q, k, v, activation="relu")


def test_stages_are_marked_forward_and_backward():
    seen: list[tuple[str, bool, bool]] = []
    q, k, v = qkv_gqa(6, 6, 2, 2, d=D, dv=4)
    with stages.listening(lambda name, entering: seen.append((name, entering, stages.in_backward()))):
        out = dsa_attention(
            q, k, v, causal=True, topk=2, chunk_size=3, index_heads=HEADS, index_head_dim=DIM, indexer_loss=1.0
        )
        out.sum().backward()
    entered = [(name, backward) for name, entering, backward in seen if entering]
    assert ("indexer", False) in entered and ("selection", False) in entered
    assert ("attention", False) in entered and ("indexer_loss", False) in entered
    assert ("attention", True) in entered  # the backward's stage, told apart by the running autograd node
    assert sum(1 for _, entering, _ in seen if entering) == sum(1 for _, entering, _ in seen if not entering)


def test_runs_under_fake_tensor_mode_at_a_long_length():
    """Shape-static: --predict sizes it without data (here 2048 keys, chunked, with backward)."""
    with FakeTensorMode():
        q = torch.randn(1, 4, 2048, 16, requires_grad=True)
        k = torch.randn(1, 2, 2048, 16, requires_grad=True)
        v = torch.randn(1, 2, 2048, 16, requires_grad=True)
        out = dsa_attention(q, k, v, causal=True, topk=64, index_heads=4, index_head_dim=8, chunk_size=512)
        out.sum().backward()
        assert out.shape == (1, 4, 2048, 16) and k.grad.shape == k.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_select_as_float32_and_return_their_dtype(dtype):
    q, k, v = (x.detach().float() for x in qkv_gqa(9, 9, 4, 2, d=8, dv=8, dtype=torch.float32, seed=8))
    opts = dict(causal=True, topk=4, index_heads=2, index_head_dim=4, chunk_size=4)
    half = dsa_attention(q.to(dtype), k.to(dtype), v.to(dtype), **opts)
    assert half.dtype == dtype
    full = dsa_attention(*(x.to(dtype).float() for x in (q, k, v)), **opts)
    torch.testing.assert_close(half.float(), full, rtol=0, atol=2e-2)
