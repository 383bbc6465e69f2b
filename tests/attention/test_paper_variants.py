"""The authors' benchmark code as registry variants (vanilla_paper, qchunk_paper, topk_paper).

Numerics: with dropout off they are our exact counterparts (float64, 1e-10); with dropout
their gradients are those of their own forward, chunk by chunk, which the authors' code
(one RNG state replayed for every chunk) got wrong. Memory: what the authors' code keeps
and holds, counted with the live-bytes tracker.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd import gradcheck

from attention_reference import TOL, assert_all_close, out_and_grads, qkv
from live_bytes import LiveBytes
from topk_bench import attention
from topk_bench.attention import MultiHeadAttention
from topk_bench.attention.methods import paper

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

# (paper variant, our counterpart, options); L = 12: chunk 4 divides it (3 chunks), chunk 5
# does not (torch.chunk into 12 // 5 = 2 chunks of 6, larger than the chunk size).
PAIRS = [
    ("vanilla_paper", "vanilla", {}),
    ("qchunk_paper", "qchunk", {"chunk_size": 4}),
    ("qchunk_paper", "qchunk", {"chunk_size": 5}),
    ("topk_paper", "topk", {"chunk_size": 4, "topk": 3}),
    ("topk_paper", "topk", {"chunk_size": 5, "topk": 7}),
    ("topk_paper", "topk", {"chunk_size": 5, "topk": 100}),  # more than Lk: every key
]
# Causal masks of ours and theirs agree only for Lq == Lk until every entry is bottom-right
# aligned; non-square causal shapes are checked against a bottom-right reference below.
SHAPES = [(12, 12, True), (12, 12, False), (12, 17, False), (12, 7, False)]


def ids(x):
    return str(x)


@pytest.mark.parametrize("lq,lk,causal", SHAPES, ids=ids)
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("name,ours,options", PAIRS, ids=ids)
def test_without_dropout_each_variant_equals_our_counterpart(name, ours, options, activation, lq, lk, causal):
    q, k, v = qkv(lq, lk)
    got = out_and_grads(attention.get(name), q, k, v, causal=causal, activation=activation, dropout=0.0, **options)
    want = out_and_grads(attention.get(ours), q, k, v, causal=causal, activation=activation, **options)
    assert_all_close(got, want)


@pytest.mark.parametrize("name,ours,options", PAIRS[:4], ids=ids)
def test_scale_inside_equals_scaling_q_beforehand(name, ours, options):
    q, k, v = qkv(12, 12)
    got = out_and_grads(attention.get(name), q, k, v, causal=True, dropout=0.0, scale=0.3, **options)
    want = out_and_grads(lambda q, k, v: attention.get(ours)(q * 0.3, k, v, causal=True, **options), q, k, v)
    assert_all_close(got, want)


def bottom_right_reference(q, k, v, activation, topk=None):
    """Dense: query i (at position Lk - Lq + i) attends key j iff j <= Lk - Lq + i; an empty row gives 0."""
    lq, lk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1)
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq).expand(scores.shape)
    if topk is not None and topk < lk:
        ranked = scores.masked_fill(~allowed, float("-inf")).sort(dim=-1, descending=True).values
        allowed = allowed & (scores >= ranked[..., topk - 1 : topk])
    if activation == "relu":
        return (torch.relu(scores) * allowed) @ v
    e = torch.exp(scores - scores.masked_fill(~allowed, float("-inf")).amax(-1, keepdim=True).nan_to_num(neginf=0))
    e = e * allowed
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300) @ v


@pytest.mark.parametrize("lq,lk", [(7, 12), (12, 7)])  # one new block of queries; more queries than keys
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize(
    "name,options",
    [("vanilla_paper", {}), ("qchunk_paper", {"chunk_size": 3}), ("topk_paper", {"chunk_size": 3, "topk": 4})],
    ids=ids,
)
def test_causal_masking_is_bottom_right_aligned(name, options, activation, lq, lk):
    q, k, v = qkv(lq, lk)
    got = out_and_grads(attention.get(name), q, k, v, causal=True, activation=activation, dropout=0.0, **options)
    want = out_and_grads(lambda q, k, v: bottom_right_reference(q, k, v, activation, options.get("topk")), q, k, v)
    assert_all_close(got, want)
    if lq > lk:  # the first Lq - Lk queries see no key: zeros, never their code's average of all values
        assert got[0][..., : lq - lk, :].abs().max() == 0


@pytest.mark.parametrize(
    "name,options",
    [
        ("vanilla_paper", {}),
        ("qchunk_paper", {"chunk_size": 4}),
        ("qchunk_paper", {"chunk_size": 5}),
        ("topk_paper", {"chunk_size": 5, "topk": 4}),
    ],
    ids=ids,
)
def test_a_precomputed_mask_is_the_whole_mask(name, options):
    q, k, v = qkv(12, 12)
    fn = attention.get(name)
    causal = torch.ones(12, 12, dtype=torch.bool).triu(1)  # True = masked, as their benchmark built it
    got = out_and_grads(fn, q, k, v, mask=causal, dropout=0.0, **options)
    assert_all_close(got, out_and_grads(fn, q, k, v, causal=True, dropout=0.0, **options))
    # Per batch element, broadcast over heads; a row with nothing allowed gives zeros.
    padding = torch.zeros(2, 1, 12, 12, dtype=torch.bool)
    padding[0, :, :, [2, 5]] = True
    padding[1, :, 3, :] = True
    got = out_and_grads(fn, q, k, v, mask=padding, dropout=0.0, **options)
    assert all(torch.isfinite(t).all() for t in got)
    assert got[0][1, :, 3].abs().max() == 0 and got[1][1, :, 3].abs().max() == 0
    want = out_and_grads(attention.get("vanilla_paper"), q, k, v, mask=padding, dropout=0.0)
    if "topk" not in options:
        assert_all_close(got, want)


def seeded(name, **options):
    """The variant with the RNG reseeded before every call: the same dropout masks each time."""
    fn = attention.get(name)

    def run(q, k, v):
        torch.manual_seed(1234)
        return fn(q, k, v, **options)

    return run


# Several chunks of unequal sizes (L = 11, chunk 3: torch.chunk into 3 pieces of 4, 4, 3).
DROPOUT_CASES = [
    ("vanilla_paper", {}),
    ("qchunk_paper", {"chunk_size": 3}),
    ("topk_paper", {"chunk_size": 3, "topk": 5}),
]


@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("name,options", DROPOUT_CASES, ids=ids)
def test_with_dropout_gradients_are_those_of_the_forward(name, options, activation):
    q, k, v = qkv(11, 11, d=3, dv=2, b=1, h=2)
    fn = seeded(name, causal=True, activation=activation, dropout=0.1, scale=0.7, **options)
    first, again = fn(q, k, v), fn(q, k, v)
    assert torch.equal(first, again)  # reseeded: fixed masks
    without = attention.get(name)(q, k, v, causal=True, activation=activation, dropout=0.0, scale=0.7, **options)
    assert not torch.allclose(first, without)  # dropout does drop
    assert gradcheck(fn, (q, k, v), fast_mode=True)


def test_backward_replays_each_chunk_mask_whatever_the_rng_did_since():
    q, k, v = qkv(11, 11, d=3, dv=2, b=1, h=2)
    fn = seeded("qchunk_paper", causal=True, dropout=0.3, chunk_size=3)
    want = torch.autograd.grad(fn(q, k, v).sum(), (q, k, v))
    out = fn(q, k, v)
    torch.rand(1000)  # the global RNG moves on between forward and backward
    state = torch.get_rng_state()
    got = torch.autograd.grad(out.sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)
    assert torch.equal(torch.get_rng_state(), state)  # and backward leaves it where it was


@pytest.mark.parametrize("name,options", DROPOUT_CASES[1:], ids=ids)
def test_the_authors_replayed_rng_state_fails_the_same_gradient_check(name, options, monkeypatch):
    # Their code: one state holder per layer, overwritten by every chunk's forward, so every
    # chunk's backward replays the last chunk's state (another chunk's dropout mask).
    shared = {}
    monkeypatch.setattr(paper, "new_chunk_rng", lambda device: shared.setdefault("rng", paper.ChunkRng(device)))
    q, k, v = qkv(11, 11, d=3, dv=2, b=1, h=2)
    fn = seeded(name, causal=True, dropout=0.1, **options)
    assert not gradcheck(fn, (q, k, v), fast_mode=True, raise_exception=False)
    # With one chunk there is nothing to confuse: the same holder is right.
    fn = seeded(name, causal=True, dropout=0.1, **{**options, "chunk_size": 100})
    assert gradcheck(fn, (q, k, v), fast_mode=True)


# --- memory (float32, like the paper) -------------------------------------------------------

B, H, L, D, C, K = 1, 2, 256, 8, 64, 4
BLOCK = B * H * C * L * 4  # one float32 C x Lk matrix (all heads)
GRADS = 3 * B * H * L * D * 4  # dq, dk, dv


def profile(name, mask=None, **options):
    """(bytes the graph keeps after forward besides the output, backward peak above that less the gradients)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    cotangent = torch.randn(B, H, L, D)
    existing = (q, k, v, cotangent) + (() if mask is None else (mask,))
    with LiveBytes(*existing) as tracker:
        out = attention.get(name)(q, k, v, **options, **({} if mask is None else {"mask": mask}))
        kept = tracker.poll()
        tracker.reset_peak()
        torch.autograd.backward(out, cotangent)
    return kept - out.nbytes, tracker.peak - kept - GRADS


def causal_input_mask():
    return torch.ones(L, L, dtype=torch.bool).triu(1)


# What each chunk's node caches besides k and v: its queries, gathered by index (copies, as
# theirs), and the int64 row index the gathers' backward keeps.
QUERY_ROWS = B * H * L * D * 4 + L * 8
# Linear-sized extras of backward (the index backward's zero-filled gradient of q, ...) stay
# under a quarter of a block at these shapes.
LINEAR = 0.25 * BLOCK


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_qchunk_paper_keeps_the_inputs_only_and_holds_several_blocks_in_backward(dropout):
    options = {"chunk_size": C, "dropout": dropout}
    kept, backward = profile("qchunk_paper", **options)
    assert kept == QUERY_ROWS
    # d_attn, recomputed scores, softmax (kept by autograd), d_scores; with dropout (on the
    # CPU) also its float noise and the dropped weights.
    blocks = 6 if dropout else 4
    assert blocks * BLOCK <= backward <= blocks * BLOCK + LINEAR
    # Scaling inside: + the gradient of the scaled scores.
    _, scaled = profile("qchunk_paper", scale=0.125, chunk_size=C, dropout=0.0)
    assert 5 * BLOCK <= scaled <= 5 * BLOCK + LINEAR
    # Masked: each chunk also caches its C x Lk bool mask, built per chunk when causal,
    # gathered from the given mask otherwise.
    kept, _ = profile("qchunk_paper", causal=True, **options)
    assert kept == QUERY_ROWS + L * L
    kept, _ = profile("qchunk_paper", mask=causal_input_mask(), **options)
    assert kept == QUERY_ROWS + L * L
    # Ours: one C x Lk matrix and its gradient.
    _, ours = profile("qchunk", causal=True, chunk_size=C)
    assert ours <= 2.1 * BLOCK and backward >= 1.9 * ours


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_topk_paper_caches_top_values_and_indices_and_reuses_one_block(dropout):
    kept, backward = profile("topk_paper", causal=True, chunk_size=C, topk=K, dropout=dropout, scale=0.125)
    assert kept == QUERY_ROWS + B * H * L * K * (4 + 8)  # + float32 top values and their int64 indices
    assert BLOCK <= backward <= 1.5 * BLOCK  # one C x Lk block (d_attn's, reused), not two


def test_vanilla_paper_keeps_dense_weights():
    kept, _ = profile("vanilla_paper", mask=causal_input_mask(), dropout=0.0)
    assert kept >= B * H * L * L * 4


# --- registry and layer -----------------------------------------------------------------------


def test_paper_variants_describe_themselves():
    expected = {
        "vanilla_paper": ("Vanilla, paper code", True),
        "qchunk_paper": ("Q-chunking, paper code (size=1024)", True),
        "topk_paper": ("Top-k, paper code (size=1024, topk=128)", False),
    }
    for name, (legend, exact) in expected.items():
        spec = attention.spec(name)
        assert spec.legend() == legend and spec.exact is exact
        assert spec.resolve()["dropout"] == 0.1 and spec.resolve()["scale"] == 1.0 and spec.resolve()["mask"] is None
        assert spec.causal and set(spec.activations) == {"softmax", "relu"} and spec.predictable and spec.gqa is None
    assert attention.spec("qchunk_paper").legend({"chunk_size": 512}) == "Q-chunking, paper code (size=512)"


@pytest.mark.parametrize("name", ["vanilla_paper", "qchunk_paper", "topk_paper"])
def test_bad_arguments_are_refused(name):
    q, k, v = qkv(4, 4)
    fn = attention.get(name)
    with pytest.raises(ValueError, match="dropout"):
        fn(q, k, v, dropout=1.0)
    with pytest.raises(ValueError, match="scale"):
        fn(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="activation"):
        fn(q, k, v, activation="gelu")
    with pytest.raises(ValueError, match="leading dims"):
        fn(q, k[:, :1], v[:, :1])  # grouped-query heads are not supported
    with pytest.raises(ValueError, match="mask"):
        fn(q, k, v, mask=torch.zeros(4, 4))


def test_layer_scales_inside_the_attention_on_request(f64):
    torch.manual_seed(0)
    theirs = MultiHeadAttention(8, 2, "qchunk_paper", causal=True, scale_in_attention=True, chunk_size=4, dropout=0.0)
    torch.manual_seed(0)
    ours = MultiHeadAttention(8, 2, "qchunk", causal=True, chunk_size=4)
    assert theirs.attention.options["scale"] == 4**-0.5  # head_dim 4
    x = torch.randn(2, 9, 8, requires_grad=True)
    results = []
    for layer in (theirs, ours):
        out = layer(x)
        results.append((out, *torch.autograd.grad(out.square().sum(), (x, layer.q_proj.weight, layer.k_proj.weight))))
    assert_all_close(*results)
    with pytest.raises(ValueError, match="has none"):
        MultiHeadAttention(8, 2, "qchunk", scale_in_attention=True)
    with pytest.raises(ValueError, match="itself"):
        MultiHeadAttention(8, 2, "qchunk_paper", scale_in_attention=True, scale=0.5)


# Peaks above baseline of the authors' code, measured once by running it (ag1988/top_k_attention
# at 1f0e736, nocache_attention/modeling.py BenchmarkSelfAttention, 'Q-chunking' with topk -1
# and 128) on the CPU under topk_bench's live-bytes tracker: causal BERT-base layer, batch 1,
# chunk 1024, forward + backward of out.mean(), their dropout set to p.
AUTHORS_PEAKS = {  # (L, p): (query chunking, top-128)
    (1024, 0.0): (270806024, 112471048),
    (1024, 0.1): (321137672, 118762504),
    (2048, 0.0): (551832584, 200559624),
    (2048, 0.1): (652495880, 206851080),
    (4096, 0.0): (1122274312, 395611144),
    (4096, 0.1): (1323600904, 395611144),
}


def layer_peak(impl, seq_len, **options):
    """Peak live bytes above parameters and input of one forward + backward, sized under FakeTensorMode
    (the harness's prediction, without the harness)."""
    with FakeTensorMode():
        torch.manual_seed(0)
        layer = MultiHeadAttention(768, 12, impl, causal=True, **options)
        x = torch.randn(1, seq_len, 768, requires_grad=True)
        with LiveBytes(x, *layer.parameters()) as tracker:
            out = layer(x)  # alive through backward, as in their script (and the harness)
            out.mean().backward()
    return tracker.peak


@pytest.mark.parametrize("seq_len,dropout", AUTHORS_PEAKS)
def test_predicted_peaks_are_the_authors_measured_ones(seq_len, dropout):
    theirs = (
        layer_peak("qchunk_paper", seq_len, chunk_size=1024, dropout=dropout, scale_in_attention=True),
        layer_peak("topk_paper", seq_len, chunk_size=1024, topk=128, dropout=dropout, scale_in_attention=True),
    )
    assert theirs == AUTHORS_PEAKS[seq_len, dropout]
    # Their query chunking against ours: about 2x without dropout, 2.4-2.5x with.
    ratio = theirs[0] / layer_peak("qchunk", seq_len, chunk_size=1024)
    assert (2.0 if dropout == 0 else 2.35) <= ratio <= 2.6
