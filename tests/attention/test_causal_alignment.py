"""Bottom-right causal alignment (query i of Lq sits at position Lk - Lq + i), float64 at 1e-10.

The dense agreement tests (test_implementations, test_topk_fast, test_gqa) compare with
the reference's mask; these check the properties the alignment exists for, without it.
"""

import math

import pytest
import torch

import topk_bench.attention
from attention_reference import TOL, out_and_grads, qkv, reference_attention
from topk_bench.attention.methods.performer import draw_projection, performer_attention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

torch.manual_seed(0)
PROJECTION = draw_projection(16, 5).double()

# Options that make chunking and selection happen (topk < Lk, chunk_size < Lq).
CASES = [
    ("vanilla", {}),
    ("sdpa", {}),
    ("qchunk", {"chunk_size": 3}),
    ("topk", {"chunk_size": 3, "topk": 3}),
    ("topk_sparse", {"chunk_size": 3, "topk": 3}),
    ("topk_fast", {"chunk_size": 3, "topk": 3}),
    ("performer", {"projection": PROJECTION, "chunk_size": 3}),
]
IDS = [name for name, _ in CASES]


def _fn(name):
    return performer_attention if name == "performer" else topk_bench.attention.get(name)


def test_reference_mask_is_bottom_right():
    # Against an explicit double loop over (query, key) pairs.
    q, k, v = qkv(3, 5, b=1, h=1)
    scores = (q @ k.transpose(-2, -1))[0, 0]
    want = torch.zeros(3, 4, dtype=torch.float64)
    for i in range(3):
        allowed = [j for j in range(5) if j <= 5 - 3 + i]  # query i sits at position 2 + i
        w = torch.softmax(scores[i, allowed], dim=-1)
        want[i] = sum(w[n] * v[0, 0, j] for n, j in enumerate(allowed))
    torch.testing.assert_close(reference_attention(q, k, v, causal=True)[0, 0], want, **TOL)


@pytest.mark.parametrize("new", [1, 3])
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_new_queries_against_the_cache_equal_the_last_rows_of_the_full_sequence(name, options, new):
    # What a KV cache relies on: the last `new` queries of a causal sequence, attending the
    # whole sequence's keys, give the last rows of the full (square) causal attention.
    q, k, v = qkv(8, 8, seed=new)
    fn = _fn(name)
    full = fn(q, k, v, causal=True, **options)
    tail = fn(q[..., -new:, :], k, v, causal=True, **options)
    torch.testing.assert_close(tail, full[..., -new:, :], **TOL)
    if name in ("topk", "topk_fast"):  # their decode paths (no gradient)
        with torch.no_grad():
            torch.testing.assert_close(fn(q[..., -new:, :], k, v, causal=True, **options), full[..., -new:, :], **TOL)


# Performer's causal and non-causal estimators use different key feature maps (see its
# module doc), so they differ even where the masks agree; its prefix has its own test below.
@pytest.mark.parametrize("name,options", CASES[:-1], ids=IDS[:-1])
def test_one_new_token_attends_every_key(name, options):
    q, k, v = qkv(1, 9, seed=4)
    fn = _fn(name)
    torch.testing.assert_close(fn(q, k, v, causal=True, **options), fn(q, k, v, causal=False, **options), **TOL)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_rows_before_every_key_give_zeros_and_zero_gradients(name, options):
    # Lq = 9 queries, Lk = 4 keys: queries 0..4 sit before key 0 (no allowed key).
    q, k, v = qkv(9, 4, seed=5)
    out, dq, dk, dv = out_and_grads(_fn(name), q, k, v, causal=True, **options)
    for t in (out, dq, dk, dv):
        assert torch.isfinite(t).all()
    assert out[..., :5, :].abs().max() == 0 and dq[..., :5, :].abs().max() == 0
    assert out[..., 5:, :].abs().min() > 0  # the other rows do attend
    # The last 4 rows are the square causal problem on the last 4 queries.
    torch.testing.assert_close(out[..., 5:, :], _fn(name)(q[..., 5:, :], k, v, causal=True, **options), **TOL)


def test_performer_cache_prefix_equals_the_quadratic_estimator():
    # The first Lk - Lq keys start the prefix sums: same as the L x L masked feature products.
    import performer_pytorch.performer_pytorch as pp

    from topk_bench.attention.methods.performer import causal_key_features

    q, k, v = qkv(4, 9, seed=6)
    with torch.no_grad():
        q.mul_(0.5 / math.sqrt(5))
        k.mul_(0.5)
    phi_q = pp.softmax_kernel(q * math.sqrt(5), projection_matrix=PROJECTION, is_query=True)
    a = (phi_q @ causal_key_features(k, PROJECTION).transpose(-2, -1)).tril(diagonal=9 - 4)
    want = (a @ v) / a.sum(dim=-1, keepdim=True)
    got = performer_attention(q, k, v, causal=True, projection=PROJECTION, chunk_size=3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
