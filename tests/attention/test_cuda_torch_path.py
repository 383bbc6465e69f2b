"""The batched torch path on CUDA (topk_bench/attention/shared/cuda_torch.py), run on CPU tensors under
``hardware.target("cuda")``
(plain torch: the same ops as on a GPU) against the float64 oracle: topk_fast's decode gathers (index_select + bmm),
its training tiles and backward groups, page_topk's half summaries and one-part gathers; the switch back to the path
the H100 measured, its provenance, and ``--predict --device cuda`` of both paths."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import topk_bench.attention
from attention_reference import qkv_gqa, reference_attention, with_repeated_kv
from live_bytes import LiveBytes
from topk_bench.attention import provenance
from topk_bench.attention.kernels import triton as tk
from topk_bench.attention.methods import topk_fast
from topk_bench.attention.methods.page_topk import _table, page_bounds, page_summaries
from topk_bench.attention.shared import cuda_torch, decode, hardware

pytestmark = pytest.mark.usefixtures("single_thread")

fast = topk_bench.attention.get("topk_fast")
page = topk_bench.attention.get("page_topk")
MIB = 1 << 20


@pytest.fixture
def cuda(monkeypatch):
    """As on a CUDA machine whose topk_fast takes the torch path (triton's kernels are tested on their own)."""
    monkeypatch.setenv(tk.SWITCH_ENV, "0")
    monkeypatch.delenv(cuda_torch.ENV, raising=False)
    with hardware.target("cuda"):
        yield monkeypatch


def _oracle(q, k, v, **kw):
    fn = with_repeated_kv(reference_attention) if q.shape[1] != k.shape[1] else reference_attention
    return fn(*(t.detach().double() for t in (q, k, v)), **kw)


# -- topk_fast's decode: the selected V rows copied and weighed by one bmm ----------------------------------------


@pytest.mark.parametrize(
    "lq, lk, topk, causal",
    [(1, 300, 20, True), (3, 257, 40, True), (2, 50, 64, False)],  # k >= Lk: every key
)
def test_decode_gathers_match_the_float64_oracle(cuda, lq, lk, topk, causal):
    q, k, v = (t.detach().float() for t in qkv_gqa(lq, lk, 8, 2, d=16, dv=8, seed=lq + lk))
    calls = []
    real = decode.gathered_output
    cuda.setattr(topk_fast, "gathered_output", lambda *a: calls.append(a) or real(*a))
    with torch.no_grad():
        got = fast(q, k, v, causal=causal, topk=topk)
    assert len(calls) == 1  # the batched path ran
    torch.testing.assert_close(got.double(), _oracle(q, k, v, causal=causal, topk=topk), rtol=1e-5, atol=1e-5)


def test_decode_gathers_are_the_bags_sums_in_parts():
    # Float64: the two ways sum the same products; parts of 3 rows' V rows (7 parts of 21 rows) change nothing.
    g = torch.Generator().manual_seed(1)
    bkv, rows, kk, lk, dv = 3, 7, 5, 40, 6
    weights = torch.rand(bkv, rows, kk, generator=g, dtype=torch.float64)
    where = torch.randint(0, lk, (bkv, rows, kk), generator=g)
    v = torch.randn(1, bkv, lk, dv, generator=g, dtype=torch.float64)
    q = torch.empty(1, bkv, rows, 4)  # only its shape: [.., Hq, Lq] of the output
    want = decode.decode_output(weights, where, q, v)
    torch.testing.assert_close(decode.gathered_output(weights, where, q, v), want, rtol=0, atol=1e-12)
    old = decode.GATHERED_OUTPUT_BYTES
    try:
        decode.GATHERED_OUTPUT_BYTES = 3 * kk * dv * 8
        torch.testing.assert_close(decode.gathered_output(weights, where, q, v), want, rtol=0, atol=1e-12)
    finally:
        decode.GATHERED_OUTPUT_BYTES = old


def test_half_decode_gathers_match_the_bags(cuda):
    # bf16 ranked by its own products: both paths select the same keys, weights rounded to bf16 alike.
    q, k, v = (t.detach().bfloat16() for t in qkv_gqa(2, 500, 8, 2, d=32, dv=16, seed=5))
    with torch.no_grad():
        batched = fast(q, k, v, causal=True, topk=64)
        cuda.setenv(cuda_torch.ENV, cuda_torch.BAGS)
        bags = fast(q, k, v, causal=True, topk=64)
    torch.testing.assert_close(batched.float(), bags.float(), rtol=0, atol=2 * 2**-8)


# -- topk_fast's training torch path: tiles of chunk_size rows, larger backward groups --------------------------


def test_training_tiles_and_groups_follow_the_path_and_match_the_float64_oracle(cuda):
    lq = lk = 1100
    q, k, v = (t.detach().float().requires_grad_() for t in qkv_gqa(lq, lk, 4, 2, d=8, dv=8, b=1, seed=3))
    want_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = with_repeated_kv(reference_attention)(*want_leaves, causal=True, topk=16)
    ramp = torch.linspace(-1, 1, want.numel(), dtype=torch.float64).reshape(want.shape)
    want_grads = torch.autograd.grad(want, want_leaves, ramp)
    tiles, groups = [], []
    tile_scores, backward_group = topk_fast._tile_scores, topk_fast._backward_group
    cuda.setattr(topk_fast, "_tile_scores", lambda *a: tiles.append(a[3]) or tile_scores(*a))
    cuda.setattr(topk_fast, "_backward_group", lambda *a, **kw: groups.append(1) or backward_group(*a, **kw))
    # Entries per K/V head: 2 query heads x 1100 rows x 16 = 35,200; the CPU's constant (also the bags path's)
    # shrunk to one head per group, to show that the batched path reads its own.
    cuda.setattr(topk_fast, "BACKWARD_ENTRIES", 35_200)
    for path, n_tiles, n_groups in ((cuda_torch.BATCHED, 1, 1), (cuda_torch.BAGS, 3, 2)):
        cuda.setenv(cuda_torch.ENV, path)
        tiles.clear(), groups.clear()
        out = fast(q, k, v, causal=True, topk=16, chunk_size=lq)
        grads = torch.autograd.grad(out, (q, k, v), ramp.float())
        assert (len(tiles), len(groups)) == (n_tiles, n_groups), path
        for name, got, ref in zip(("out", "dq", "dk", "dv"), (out, *grads), (want, *want_grads)):
            where = f"{path} {name}"
            torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4, msg=lambda m, w=where: f"{w}: {m}")


class _AtenOps(TorchDispatchMode):
    """Every aten op run while active (backward included), with the dtype of its first tensor argument."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = next((t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
        self.seen.add((func._schema.name, None if first is None else first.dtype))
        return func(*args, **(kwargs or {}))


SAMPLED = "aten::_embedding_bag_per_sample_weights_backward"
# Training calls of every implementation whose torch path on CUDA computes sampled products: topk_fast's backward,
# the block-sparse attention's forward and backward (page_topk's prefill, block_topk, dsa, nsa share it).
TRAINING_CALLS = [
    ("topk_fast", dict(topk=16)),
    ("page_topk", dict(page_size=4, token_budget=32)),
    ("block_topk", dict(block_size=4, topk_blocks=4)),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl, options", TRAINING_CALLS)
def test_half_training_on_cuda_calls_no_op_that_lacks_a_cuda_kernel_for_its_dtype(cuda, impl, options, dtype):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in qkv_gqa(96, 96, 4, 2, d=16, dv=8, b=1, seed=2))
    lacking = {(name, dt) for name, dtypes in cuda_torch.NO_CUDA_KERNEL.items() for dt in dtypes}
    assert (SAMPLED, torch.bfloat16) in lacking
    for path in cuda_torch.PATHS:
        cuda.setenv(cuda_torch.ENV, path)
        with _AtenOps() as ops:
            out = topk_bench.attention.get(impl)(q, k, v, causal=True, **options)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        assert not ops.seen & lacking, (path, ops.seen & lacking)
        # The sampled product ran (the mode sees the backward): in float32 copies for bf16, in float16 natively.
        assert (SAMPLED, torch.float32 if dtype == torch.bfloat16 else dtype) in ops.seen, path


def test_the_sampled_product_keeps_the_cpus_op_and_dtype():
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in qkv_gqa(96, 96, 4, 2, d=16, dv=8, b=1, seed=2))
    with _AtenOps() as ops:
        out = fast(q, k, v, causal=True, topk=16)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert (SAMPLED, torch.bfloat16) in ops.seen and (SAMPLED, torch.float32) not in ops.seen


@pytest.mark.parametrize("path", cuda_torch.PATHS)
def test_bf16_training_matches_the_float64_oracle(cuda, path):
    # Ranked by float32 scores (float_scores): the keys the float64 oracle keeps. Weights, dS and the bags' sums are
    # rounded to bf16 on the way: within 2^-8 of each result's largest magnitude here (0.74-0.92 of it), checked at
    # twice that.
    cuda.setenv(cuda_torch.ENV, path)
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in qkv_gqa(300, 300, 4, 2, d=16, dv=8, b=1, seed=4))
    want_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = with_repeated_kv(reference_attention)(*want_leaves, causal=True, topk=16)
    ramp = torch.linspace(-1, 1, want.numel(), dtype=torch.float64).reshape(want.shape)
    want_grads = torch.autograd.grad(want, want_leaves, ramp)
    out = fast(q, k, v, causal=True, topk=16, float_scores=True)
    grads = torch.autograd.grad(out, (q, k, v), ramp.bfloat16())
    for name, got, ref in zip(("out", "dq", "dk", "dv"), (out, *grads), (want, *want_grads)):
        assert got.dtype == torch.bfloat16, name
        scale = ref.abs().max().item()
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=2**-7 * scale, msg=lambda m, n=name: f"{n}: {m}")


def test_tiles_grow_while_their_scores_fit_the_bound():
    # A causal BERT-base layer (12 heads, float32 scores): 768 KiB a row at 16K, 1.5 MiB at 32K, 3 MiB at 64K.
    row = 12 * 4
    tiles = [cuda_torch.row_tile(row * n, topk_fast.ROW_TILE) for n in (4096, 16384, 32768, 65536)]
    assert tiles == [2048, 1365, 682, 512]  # bounded by 1 GiB of scores, never below the CPU's 512 rows
    assert [r1 - r0 for r0, r1, *_ in topk_fast._tiles(16384, 16384, 128, True, 1024, 0, tiles[1])] == [1024] * 16


# -- page_topk: half summaries, pages copied in one part ---------------------------------------------------------


def _oracle_pages(q, k, page_size, n, causal):
    """Float64 group bounds ``[B, Hkv, Lq, P]`` (ineligible pages -inf) of bf16 inputs, as page_topk ranks them."""
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    p = -(-lk // page_size)
    pad = p * page_size - lk
    kp = torch.cat((k.double(), k.double()[:, :, -1:].expand(b, hkv, pad, d)), dim=2).view(b, hkv, p, page_size, d)
    lo, hi = kp.amin(3), kp.amax(3)
    qg = q.double().view(b, hkv, hq // hkv, lq, 1, d)
    bound = torch.maximum(qg * lo.unsqueeze(2).unsqueeze(3), qg * hi.unsqueeze(2).unsqueeze(3)).sum(-1)
    bound = bound.amax(2)  # the group's largest: [B, Hkv, Lq, P]
    own = (torch.arange(lq) + lk - lq) // page_size
    ids = torch.arange(p)
    shut = ids >= own.view(lq, 1) if causal else ids == own.view(lq, 1)
    return bound.masked_fill(shut, float("-inf"))


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(x), torch.frexp(x).exponent - 8)  # 2^-7 of the power of two below |x|


def test_half_summaries_pick_the_float64_oracles_pages_where_the_bounds_are_separated(cuda):
    page_size, budget, lk = 4, 40, 401
    n = budget // page_size
    q, k, v = (t.detach().bfloat16() for t in qkv_gqa(3, lk, 8, 2, d=32, dv=8, seed=11))
    summaries = page_summaries(k, page_size)
    assert summaries.dtype == torch.bfloat16  # on the batched path; float32 on the bags path:
    cuda.setenv(cuda_torch.ENV, cuda_torch.BAGS)
    assert page_summaries(k, page_size).dtype == torch.float32
    cuda.delenv(cuda_torch.ENV)
    blocks, ok = _table(q, k, True, page_size, budget, True, None, 64)  # [B, Hkv, Lq, n + 1], the own page last
    assert ok[..., :n].all()
    bound = _oracle_pages(q, k, page_size, n, True)
    ranked = bound.sort(dim=-1, descending=True).values
    nth, next_ = ranked[..., n - 1], ranked[..., n]
    separated = nth - next_ > _bf16_ulp(nth)
    chosen = torch.zeros_like(bound, dtype=torch.bool).scatter_(-1, blocks[..., :n], True)
    want = bound >= nth.unsqueeze(-1)
    assert separated.sum() >= separated.numel() // 2  # most rows exercise the claim (7 of 12 here)
    assert torch.equal(chosen[separated], want[separated])
    # Elsewhere the choice is a top-n of the rounded bounds: what it left out is within one bf16 ulp.
    worst = bound.masked_fill(~chosen, float("inf")).amin(-1)
    best_left = bound.masked_fill(chosen, float("-inf")).amax(-1)
    assert (best_left - worst <= _bf16_ulp(nth)).all()


def test_a_rounded_bound_can_tie_pages_that_float32_separates():
    # Two pages whose float32 bounds differ by less than a bf16 ulp: equal in bf16 (then topk's order decides).
    q = torch.ones(1, 1, 1, 2, dtype=torch.bfloat16)
    k = torch.tensor([[1.0, 1.0], [1.0, 1.0078125]], dtype=torch.bfloat16).view(1, 1, 2, 2)  # 2 and 2.0078125
    half, single = page_bounds(q, page_summaries(k, 1).bfloat16()), page_bounds(q, page_summaries(k, 1).float())
    assert half.dtype == torch.bfloat16 and single.dtype == torch.float32
    assert single[..., 0] < single[..., 1] and half[..., 0] == half[..., 1]


def test_page_decode_in_one_part_is_dense_softmax_over_its_pages(cuda):
    page_size, budget = 4, 48
    q, k, v = (t.detach().bfloat16() for t in qkv_gqa(2, 333, 8, 2, d=32, dv=16, seed=7))
    parts = []
    real = torch.index_select
    cuda.setattr(torch, "index_select", lambda *a, **kw: parts.append(1) or real(*a, **kw))
    options = dict(causal=True, page_size=page_size, token_budget=budget)
    with torch.no_grad():
        got = page(q, k, v, **options)
        batched_parts = len(parts)
        picked = topk_bench.attention.spec("page_topk").selection(q, k, **options)
        cuda.setattr(cuda_torch, "GATHER_BYTES", 1)  # one table row a part: the bags path's 4 MiB at this size
        parts.clear()
        assert torch.equal(page(q, k, v, **options), got)
    assert (batched_parts, len(parts)) == (2, 2 * 2 * 2 * 2)  # keys and values; x B * Hkv * Lq parts
    # The step's arithmetic in float64: bf16 scores (one rounding of the exact product), float32 softmax, weights
    # rounded to bf16 for the bf16 product with V.
    scores = (q.double() @ k.double().repeat_interleave(4, 1).transpose(-2, -1)).bfloat16().double()
    weights = torch.softmax(scores.masked_fill(~picked, float("-inf")), dim=-1).bfloat16().double()
    want = weights @ v.double().repeat_interleave(4, 1)
    torch.testing.assert_close(got.double(), want, rtol=2**-8, atol=1e-3)


# -- the switch, provenance and the CUDA prediction ----------------------------------------------------------------


def test_the_switch_is_read_at_every_call_and_checked(monkeypatch):
    q = torch.empty(1)
    monkeypatch.delenv(cuda_torch.ENV, raising=False)
    assert not cuda_torch.batched(q)  # a CPU tensor: never
    with hardware.target("cuda"):
        assert cuda_torch.batched(q)
        monkeypatch.setenv(cuda_torch.ENV, "bags")
        assert not cuda_torch.batched(q)
        monkeypatch.setenv(cuda_torch.ENV, "fast")
        with pytest.raises(ValueError, match=r"^TOPK_BENCH_CUDA_TORCH='fast': expected one of batched, bags$"):
            cuda_torch.batched(q)


def test_code_path_names_the_torch_path_on_cuda_only(monkeypatch):
    monkeypatch.delenv(cuda_torch.ENV, raising=False)

    def pairs(name, device, dtype=torch.bfloat16):
        return provenance.parse(provenance.code_path(name, device=device, dtype=dtype))

    for name in ("topk_fast", "page_topk"):
        assert pairs(name, "cuda")["cuda_torch"] == "batched"
        assert "cuda_torch" not in pairs(name, "cpu")
    monkeypatch.setenv(cuda_torch.ENV, "bags")
    assert pairs("page_topk", "cuda", torch.float32)["cuda_torch"] == "bags"


def test_a_measured_row_is_predicted_on_the_path_it_records():
    from topk_bench.predict.as_measured import BEFORE_CODE_PATH, environment

    triton, torch_path = tk.SWITCH_ENV, cuda_torch.ENV
    assert environment({"case_id": "x"}) == BEFORE_CODE_PATH == {triton: "0", torch_path: "bags"}
    row = {"code_path": "cuda_torch=batched;decode_tiles=64MiB;triton_kernels=triton:3.4.0"}
    assert environment(row) == {triton: "1", torch_path: "batched"}
    # The torch path where the measured defaults chose it (topk_bench/attention/kernels/triton/defaults.py).
    row = {"code_path": "cuda_torch=batched;decode_tiles=64MiB;triton_kernels=torch:default (faster on an H200)"}
    assert environment(row) == {triton: "0", torch_path: "batched"}
    # Written after code_path, before the cuda_torch pair: the bags path.
    row = {"code_path": "decode_tiles=64MiB;triton_kernels=torch:disabled by TOPK_BENCH_TRITON=0"}
    assert environment(row) == {triton: "0", torch_path: "bags"}


def _decode_case(impl, kv_len, **options):
    from topk_bench.case import Case

    llama = {"model": "llama-3-8b", "new_tokens": 1, "batch": 1, "kv_len": kv_len}
    return Case.make(suite="t", workload="decode", impl=impl, params=llama, options=options, mode="fwd",
                     causal=True, dtype="bfloat16", device="cuda", method="predicted")  # fmt: skip


def _fake_step(impl, kv_len, **options):
    """Peak live bytes of one Llama-3-8B decode step on fake tensors shaped for CUDA, the cache and state excluded."""
    with FakeTensorMode(), hardware.target("cuda"):
        q = torch.randn(1, 32, 1, 128, dtype=torch.bfloat16)
        k, v = (torch.randn(1, 8, kv_len, 128, dtype=torch.bfloat16) for _ in range(2))
        state = {"summaries": page_summaries(k, options["page_size"])} if impl == "page_topk" else {}
        with torch.no_grad(), LiveBytes(q, k, v, *state.values()) as tracker:
            topk_bench.attention.get(impl)(q, k, v, causal=True, **options, **state)
    return tracker


@pytest.mark.parametrize(
    "impl, options", [("topk_fast", {"topk": 512}), ("page_topk", {"page_size": 16, "token_budget": 512})]
)
def test_predict_cuda_predicts_each_path_as_its_fake_run_allocates(monkeypatch, impl, options):
    """--predict --device cuda of one decode step (8192 cached tokens, ci.toml's) on each path: every op modelled,
    the step's allocated peak that of its fake run plus CUDA kernels' own buffers (under 4 MiB), the batched path's
    largest buffer its one-part copy, and no more kernel launches than the bags path."""
    from topk_bench.predict.backends import predict_cuda
    from topk_bench.results import columns as col

    monkeypatch.setenv(tk.SWITCH_ENV, "0")
    predicted = {}
    for path in cuda_torch.PATHS:
        monkeypatch.setenv(cuda_torch.ENV, path)
        pred = predict_cuda(_decode_case(impl, 8192, **options))
        assert pred.extra[col.CUDA_UNMODELED_OPS] == ""
        step = pred.peak_bytes - pred.baseline_bytes - pred.extra[col.WORKSPACE_BYTES]
        fake = _fake_step(impl, 8192, **options)
        assert 0 <= step - fake.peak < 4 * MIB, (path, step, fake.peak)
        predicted[path] = pred.extra[col.KERNEL_LAUNCHES], fake.largest
    copied = 8 * 4 * 512 * 128 * 2 if impl == "topk_fast" else 8 * (512 + 16) * 128 * 2  # V rows; key (or V) pages
    assert predicted["batched"][1] == copied
    assert predicted["batched"][0] <= predicted["bags"][0]
