"""Grouped-query attention (K/V with fewer heads than Q): every implementation equals its
own result on K/V repeated per group, float64 at 1e-10, outputs and q/k/v gradients;
"native" implementations never allocate a repeated-K/V-sized tensor."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import topk_bench.attention
from attention_reference import assert_all_close, out_and_grads, qkv_gqa, reference_attention, with_repeated_kv
from live_bytes import LiveBytes
from topk_bench.attention.methods.performer import draw_projection, performer_attention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

D = 5
torch.manual_seed(0)
PROJECTION = draw_projection(16, D).double()


def _performer(q, k, v, **kw):
    return performer_attention(q, k, v, projection=PROJECTION, chunk_size=3, **kw)


def _topk_reference(topk):
    return lambda q, k, v, **kw: reference_attention(q, k, v, topk=topk, **kw)


# (name, options, what the implementation computes on K/V with as many heads as Q).
# Chunk sizes below the lengths, topk below Lk: chunking, selection and pruning all happen.
CASES = [
    ("vanilla", {}, topk_bench.attention.get("vanilla")),
    ("sdpa", {}, topk_bench.attention.get("vanilla")),
    ("qchunk", {"chunk_size": 3}, topk_bench.attention.get("vanilla")),
    ("topk", {"chunk_size": 3, "topk": 1000}, topk_bench.attention.get("vanilla")),  # k >= Lk: exact
    ("topk", {"chunk_size": 3, "topk": 4}, _topk_reference(4)),
    ("topk_sparse", {"chunk_size": 3, "topk": 4}, _topk_reference(4)),
    ("topk_fast", {"chunk_size": 3, "topk": 4}, _topk_reference(4)),
    ("topk_fast", {"chunk_size": 4, "topk": 2}, _topk_reference(2)),
    ("performer", {}, _performer),
]
HEADS = [(6, 3), (4, 1)]  # (Hq, Hkv): grouped, multi-query
SHAPES = [(7, 7), (5, 9), (1, 9), (9, 4)]  # (Lq, Lk): square, cache (wide), one new token, tall


def _fn(name):
    return _performer if name == "performer" else topk_bench.attention.get(name)


@pytest.mark.parametrize("lq,lk", SHAPES)
@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize(
    "name,options,repeated", CASES, ids=lambda x: x if isinstance(x, str) else getattr(x, "__name__", str(x))
)
def test_gqa_equals_repeated_kv(name, options, repeated, activation, causal, hq, hkv, lq, lk):
    if activation not in topk_bench.attention.spec(name).activations:
        pytest.skip(f"{name} does not support {activation}")
    q, k, v = qkv_gqa(lq, lk, hq, hkv, d=D, seed=lq * lk + hq)
    kw = dict(causal=causal, activation=activation)
    got = out_and_grads(_fn(name), q, k, v, **options, **kw)
    want = out_and_grads(with_repeated_kv(repeated), q, k, v, **kw)
    assert got[0].shape == (2, hq, lq, 4) and got[2].shape == k.shape
    assert_all_close(got, want)
    if name in ("topk", "topk_fast"):  # the decode path (no gradient, chunk_size >= Lq) too
        with torch.no_grad():
            decoded = _fn(name)(q, k, v, **{**options, "chunk_size": 64}, **kw)
        torch.testing.assert_close(decoded, want[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("lq,lk", [(24, 24), (24, 30), (30, 24)])
def test_sdpa_one_call_per_group_member(lq, lk):
    # Causal prefill: folding the groups would need a G*Lq x Lk mask, so sdpa calls SDPA
    # once per member of the groups instead (the shapes above are too small for that).
    from topk_bench.attention.methods.sdpa import _fold_is_cheap

    q, k, v = qkv_gqa(lq, lk, 4, 1, d=D)
    assert not _fold_is_cheap(q, k, 4, causal=True)
    got = out_and_grads(topk_bench.attention.get("sdpa"), q, k, v, causal=True)
    assert_all_close(got, out_and_grads(with_repeated_kv(topk_bench.attention.get("vanilla")), q, k, v, causal=True))


def test_grouped_heads_really_differ_from_equal_heads():
    # Guards the test above: query head h must read K/V head h // G (repeat_interleave
    # order), which differs from the tiled order h % Hkv (repeat).
    q, k, v = qkv_gqa(5, 9, 6, 3, d=D)
    interleaved = with_repeated_kv(reference_attention)(q, k, v)
    tiled = reference_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1))
    assert (interleaved - tiled).abs().max() > 1e-3
    torch.testing.assert_close(
        topk_bench.attention.get("qchunk")(q, k, v, chunk_size=2), interleaved, rtol=0, atol=1e-10
    )


def test_every_builtin_implementation_is_native():
    for name in ("vanilla", "sdpa", "qchunk", "topk", "topk_sparse", "topk_fast", "performer"):
        assert topk_bench.attention.spec(name).gqa == "native", name


@pytest.mark.parametrize("name", ["vanilla", "sdpa", "qchunk", "topk", "topk_sparse", "topk_fast", "performer"])
def test_heads_that_do_not_divide_are_refused(name):
    q, _, _ = qkv_gqa(3, 4, 3, 2)
    _, k, v = qkv_gqa(3, 4, 2, 2)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        topk_bench.attention.get(name)(q, k, v)


# Memory: B=1, Hq=8, Hkv=2 (G=4), Lq=8 queries, Lk=256 keys, d=64: every legitimate
# allocation (scores 8 x 256 per head, K-sized gradients dK, dV) is well below K repeated
# to the query heads (G x K bytes).
MEM = dict(b=1, hq=8, hkv=2, lq=8, lk=256, d=64)
MEM_OPTIONS = {
    "qchunk": {"chunk_size": 4},
    "topk": {"chunk_size": 4, "topk": 8},
    "topk_sparse": {"chunk_size": 4, "topk": 8},
    "topk_fast": {"chunk_size": 4, "topk": 8},
    "performer": {"nb_features": 16, "chunk_size": 64},
    # Selection methods at budgets below the cache, so that they really select.
    "page_topk": {"page_size": 16, "token_budget": 64, "chunk_size": 4},
    "block_topk": {"block_size": 32, "topk_blocks": 2, "chunk_size": 4},
    # A small indexer: the published one's weights (64 x 128 heads, drawn per call) would be the largest tensor.
    "dsa": {"index_heads": 4, "index_head_dim": 16, "topk": 8, "chunk_size": 4},
    "sink_window": {"sinks": 4, "window": 60},
    # Blocks, selection and window scaled to the 256 keys, so that each branch sees part of the cache.
    "nsa": {
        "compress_block": 16,
        "compress_stride": 8,
        "select_block": 16,
        "select_blocks": 4,
        "window": 32,
        "chunk_size": 4,
    },  # fmt: skip
}


def _profile(fn, causal, grad=True):
    """(largest storage allocated, peak live bytes above the inputs) over forward (+ backward)."""
    g = torch.Generator().manual_seed(0)
    m = MEM
    q = torch.randn(m["b"], m["hq"], m["lq"], m["d"], generator=g, requires_grad=grad)
    k = torch.randn(m["b"], m["hkv"], m["lk"], m["d"], generator=g, requires_grad=grad)
    v = torch.randn(m["b"], m["hkv"], m["lk"], m["d"], generator=g, requires_grad=grad)
    cotangent = torch.randn(m["b"], m["hq"], m["lq"], m["d"], generator=g)
    torch.manual_seed(0)
    with LiveBytes(q, k, v, cotangent) as tracker:
        out = fn(q, k, v, causal=causal)
        if grad:
            torch.autograd.backward(out, cotangent)
    return tracker.largest, tracker.peak, k.nbytes


@pytest.mark.parametrize("causal", [False, True])
# flex: torch's compiled kernel runs below the tracker (and has no CPU backward); its own tests cover it.
@pytest.mark.parametrize(
    "name", [s.name for s in topk_bench.attention.all_specs() if s.gqa == "native" and s.name != "flex"]
)
def test_native_gqa_never_allocates_repeated_kv(name, causal):
    fn = topk_bench.attention.get(name)
    options = MEM_OPTIONS.get(name, {})
    groups = MEM["hq"] // MEM["hkv"]
    for grad in (True, False):  # training, and the decode paths of topk / topk_fast
        largest, peak, k_bytes = _profile(lambda *a, **kw: fn(*a, **options, **kw), causal, grad)
        assert largest < groups * k_bytes, (name, grad, largest)
        assert peak < 2 * groups * k_bytes, (name, grad, peak)  # repeated K and V alone would be that


def test_repeating_kv_is_caught_by_the_memory_test():
    # Guards the test above: an implementation that repeats K/V allocates a G x K-sized tensor.
    groups = MEM["hq"] // MEM["hkv"]
    largest, peak, k_bytes = _profile(with_repeated_kv(topk_bench.attention.get("vanilla")), causal=True)
    assert largest >= groups * k_bytes and peak >= 2 * groups * k_bytes


@pytest.mark.parametrize("name", [s.name for s in topk_bench.attention.all_specs() if s.gqa and s.predictable])
def test_gqa_forward_backward_under_fake_tensors(name):
    spec = topk_bench.attention.spec(name)
    options = {
        key: value for key, value in {"chunk_size": 3, "topk": 2, "nb_features": 8}.items() if key in spec.options
    }
    for causal in (False, True):
        with FakeTensorMode():
            q = torch.randn(2, 6, 5, 4, requires_grad=True)
            k = torch.randn(2, 2, 9, 4, requires_grad=True)
            v = torch.randn(2, 2, 9, 3, requires_grad=True)
            out = spec.fn(q, k, v, causal=causal, **options)
            out.mean().backward()
            with torch.no_grad():
                decoded = spec.fn(q, k, v, causal=causal, **options)
        assert isinstance(out, FakeTensor) and out.shape == decoded.shape == (2, 6, 5, 3)
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
