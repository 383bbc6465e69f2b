"""The decode path of topk and topk_fast (no gradient, few query rows): when it is taken, that
it equals the training path and the dense reference (float64, 1e-10), and its memory."""

import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import topk_bench.attention.shared.decode as decode
from attention_reference import TOL, qkv_gqa, reference_attention, with_repeated_kv
from live_bytes import LiveBytes
from topk_bench import attention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

DECODING = ["topk", "topk_fast"]
# Half inputs ranked by float32 scores (topk always; topk_fast on request), for the tile loop's tests.
FLOAT32_RANKING = {"topk": {}, "topk_fast": {"float_scores": True}}


@pytest.fixture
def calls(monkeypatch):
    """Counts the decode path's score computations (each module imported the function by name)."""
    count = []

    def counting(*args, **kwargs):
        count.append(1)
        return decode.decode_scores(*args, **kwargs)

    for module in (attention.methods.topk, attention.methods.topk_fast):
        monkeypatch.setattr(module, "decode_scores", counting)
    return count


@pytest.mark.parametrize("name", DECODING)
def test_decode_path_is_taken_only_without_gradients_dropout_or_many_rows(name, calls):
    fn = attention.get(name)
    q, k, v = qkv_gqa(4, 9, 4, 2)
    fn(q, k, v, topk=3)
    assert not calls  # gradients are recorded
    with torch.no_grad():
        fn(q, k, v, topk=3)
        assert len(calls) == 1
        fn(q, k, v, topk=3, chunk_size=3)  # more query positions than chunk_size
        fn(q, k, v, topk=3, dropout=0.5)
        assert len(calls) == 1
    fn(q.detach(), k.detach(), v.detach(), topk=3)  # nothing requires grad
    assert len(calls) == 2
    q2, k2, v2 = qkv_gqa(decode.DECODE_ROWS + 1, 9, 2, 2)
    with torch.no_grad():
        fn(q2, k2, v2, topk=3)
    assert len(calls) == 2


def test_topk_sparse_has_no_decode_path(calls):
    q, k, v = qkv_gqa(4, 9, 4, 2)
    with torch.no_grad():
        attention.get("topk_sparse")(q, k, v, topk=3)
    assert not calls


def _padding(b, lk):
    pad = torch.zeros(b, lk, dtype=torch.bool)
    pad[0, [0, lk // 2, lk - 1]] = True
    pad[-1] = True  # nothing to attend: zeros, no NaN
    return pad


# (Lq, Lk, topk): one token, a few rows, rows past the keys (Lq > Lk), topk above the
# allowed keys, topk 1, a single key, and the pruned top-k of topk_fast (Lk >> topk).
SHAPES = [(1, 9, 3), (4, 9, 4), (9, 4, 2), (5, 12, 40), (3, 20, 1), (2, 1, 5), (16, 300, 8)]


@pytest.mark.parametrize("tile_bytes", [None, 1], ids=["one-tile", "key-tiles"])
@pytest.mark.parametrize("lq,lk,topk", SHAPES)
@pytest.mark.parametrize("name", DECODING)
def test_decode_equals_training_path_and_reference(name, lq, lk, topk, tile_bytes, monkeypatch, calls):
    if tile_bytes is not None:  # one key per tile: every tile boundary and mask split is exercised
        monkeypatch.setattr(decode, "DECODE_TILE_BYTES", tile_bytes)
    fn = attention.get(name)
    for (hq, hkv), causal, relu, padding in itertools.product(
        [(6, 3), (2, 2)], (False, True), (False, True), (False, True)
    ):
        q, k, v = qkv_gqa(lq, lk, hq, hkv, seed=lq * lk + hq)
        kw = dict(
            causal=causal,
            activation="relu" if relu else "softmax",
            topk=topk,
            key_padding_mask=_padding(2, lk) if padding else None,
        )
        trained = fn(q, k, v, chunk_size=3, **kw)
        with torch.no_grad():
            decoded = fn(q, k, v, chunk_size=64, **kw)
        want = with_repeated_kv(reference_attention)(q, k, v, **kw)
        torch.testing.assert_close(decoded, trained, **TOL)
        torch.testing.assert_close(decoded, want, **TOL)
        assert torch.isfinite(decoded).all()
    assert len(calls) == 16


@pytest.mark.parametrize("name", DECODING)
def test_half_decode_never_copies_all_of_k_to_float32(name, monkeypatch):
    # bf16 cache of 2 K/V heads x 4096 keys x 64: its float32 copy is 2 MiB; the decode path
    # converts one tile of keys at a time (here 128 KiB: 256 keys), the training path
    # (gradients) all of K at once. The step's scores (2 x 8 rows x 4096 keys) take 256 KiB.
    monkeypatch.setattr(decode, "DECODE_TILE_BYTES", 128 << 10)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 2, 64, generator=g).bfloat16()
    k = torch.randn(1, 2, 4096, 64, generator=g).bfloat16()
    v = torch.randn(1, 2, 4096, 64, generator=g).bfloat16()
    fn = attention.get(name)
    k_float32 = k.numel() * 4

    def largest():
        with LiveBytes(q, k, v) as tracker:
            fn(q, k, v, causal=True, topk=32, **FLOAT32_RANKING[name])
        return tracker.largest

    with torch.no_grad():
        assert largest() < k_float32 / 4
    q.requires_grad_()
    assert largest() >= k_float32  # guards the bound: the training path makes the float32 copy


@pytest.mark.parametrize("name", DECODING)
def test_decode_under_fake_tensors(name, calls):
    with FakeTensorMode(), torch.no_grad():
        q = torch.randn(1, 8, 3, 16, dtype=torch.bfloat16)
        k = torch.randn(1, 2, 1000, 16, dtype=torch.bfloat16)
        v = torch.randn(1, 2, 1000, 12, dtype=torch.bfloat16)
        pad = torch.zeros(1, 1000, dtype=torch.bool)
        out = attention.get(name)(q, k, v, causal=True, topk=16, key_padding_mask=pad)
    assert out.shape == (1, 8, 3, 12) and out.dtype == torch.bfloat16 and len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", DECODING)
def test_prediction_takes_one_product_with_the_tile_loops_peak_and_flops(name, dtype, monkeypatch):
    """Under fake tensors the tile loop is one product (a 1M-token cache at batch 8 was minutes of fake ops),
    with the same peak bytes and FLOPs as the loop, which runs where fake tensors are not recognised."""
    from torch.utils.flop_counter import FlopCounterMode

    monkeypatch.setattr(decode, "DECODE_TILE_BYTES", 16 << 10)  # 15 tiles of 64 keys and a partial one
    products = []
    matmul = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *a, **kw: products.append(1) or matmul(*a, **kw))

    def predicted():
        products.clear()
        fake = FakeTensorMode()
        with fake:
            q, k, v = (torch.randn(2, h, n, 16, dtype=dtype) for h, n in ((8, 3), (2, 1000), (2, 1000)))
        with fake, torch.no_grad(), FlopCounterMode(display=False) as flops, LiveBytes(q, k, v) as tracker:
            attention.get(name)(q, k, v, causal=True, topk=16, **FLOAT32_RANKING[name])
        return tracker.peak, flops.get_total_flops(), len(products)

    peak, flops, calls = predicted()
    monkeypatch.setattr(decode, "FakeTensor", type("NotAFakeTensor", (), {}))
    assert (peak, flops) == predicted()[:2] and flops > 0
    assert calls == 1 and predicted()[2] == 16
