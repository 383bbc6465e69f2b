"""The decode kernels of page_topk and topk_fast (topk_bench/attention/kernels/triton/decode.py), run by Triton's
interpreter on CPU tensors: the float64 oracle over the keys the torch path selects, the exact row top-k with its tie
rule, and the CUDA dispatch and memory (fake tensors) that ``--predict --device cuda`` takes."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("triton", reason="triton is not importable (the dev extra installs it)")

import topk_bench.attention
from attention_reference import qkv_gqa, reference_attention, with_repeated_kv
from live_bytes import LiveBytes
from topk_bench.attention.kernels import triton as tk
from topk_bench.attention.kernels.triton import decode as td
from topk_bench.attention.kernels.triton import launch
from topk_bench.attention.methods.page_topk import page_summaries
from topk_bench.attention.shared import hardware

pytestmark = pytest.mark.usefixtures("single_thread", "kernels_forced")


@pytest.fixture
def kernels_forced(monkeypatch):
    """TOPK_BENCH_TRITON=1: the kernels wherever they take the call (unset, the measured defaults keep
    topk_fast's decode steps on the torch path: tests/attention/test_triton_defaults.py)."""
    monkeypatch.setenv(tk.SWITCH_ENV, "1")


page = topk_bench.attention.spec("page_topk")
fast = topk_bench.attention.get("topk_fast")


def _masked_oracle(q, k, v, keep):
    """Float64 softmax attention of each query row over the keys ``keep [B, Hq, Lq, Lk]`` marks (K/V repeated)."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, dim=1) for t in (k, v))
    scores = (q.double() @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def _inputs(lq, lk, hq, hkv, dtype=torch.float32, d=8, dv=6, seed=0):
    return tuple(t.detach().to(dtype) for t in qkv_gqa(lq, lk, hq, hkv, d=d, dv=dv, b=1, seed=seed))


# Partial last pages (lk not a multiple of the page), one and several query positions, causal and not, a page table
# shared by a group of query heads (group_pages) or one per query head, a page size that is not a power of two,
# a budget of more pages than are eligible (causal: rejected picks), and a budget below one page (own page only).
PAGE_CASES = [
    # lq, lk, hq, hkv, page_size, budget, causal, group_pages
    (1, 37, 4, 2, 4, 12, True, True),
    (3, 29, 4, 2, 5, 10, False, False),
    (2, 13, 2, 1, 4, 64, True, True),
    (2, 23, 2, 2, 4, 3, True, True),
]


@pytest.mark.parametrize("lq,lk,hq,hkv,page_size,budget,causal,group_pages", PAGE_CASES)
def test_page_topk_decode_matches_the_float64_oracle(lq, lk, hq, hkv, page_size, budget, causal, group_pages):
    q, k, v = _inputs(lq, lk, hq, hkv, seed=lq * lk)
    options = dict(page_size=page_size, token_budget=budget, group_pages=group_pages)
    got = td.page_topk_decode(q, k, v, page_summaries(k, page_size), causal=causal, page_size=page_size,
                              n_top=budget // page_size, group_pages=group_pages)  # fmt: skip
    keep = page.selection(q.double(), k.double(), causal=causal, **options)
    torch.testing.assert_close(got.double(), _masked_oracle(q, k, v, keep), rtol=2e-5, atol=2e-5)
    # and the torch path's decode step (the same pages)
    torch.testing.assert_close(got, page.fn(q, k, v, causal=causal, **options), rtol=2e-5, atol=2e-5)


def test_page_topk_decode_splits_combine_to_one_softmax(monkeypatch):
    # 2 pages per product: the row's 10 table entries (9 picks and its own page) over 5 splits, combined by their
    # log-sum-exp; bfloat16 inputs (summaries in bfloat16 too: exact key values), 4 query heads per table.
    monkeypatch.setattr(td, "CHUNK_KEYS", 8)
    q, k, v = _inputs(1, 61, 8, 2, dtype=torch.bfloat16, d=16, dv=8, seed=3)
    options = dict(page_size=4, token_budget=36, group_pages=True)
    assert td._splits(2, 10, 2) == (5, 2)
    got = td.page_topk_decode(q, k, v, page_summaries(k, 4).bfloat16(), causal=True, page_size=4, n_top=9,
                              group_pages=True)  # fmt: skip
    assert got.dtype == torch.bfloat16
    keep = page.selection(q, k, causal=True, **options)
    # Scores rounded to bf16 as the torch path's half product; softmax and sums fp32.
    torch.testing.assert_close(got.double(), _masked_oracle(q, k, v, keep), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.float(), page.fn(q, k, v, causal=True, **options).float(), rtol=2e-2, atol=1e-2)


# Causal and not, softmax and relu, grouped-query heads, k >= Lk (causal rows with fewer allowed keys than k pick
# -inf ones, weight 0), several splits of the selected keys (k > GATHER_CHUNK).
TOPK_CASES = [
    # lq, lk, hq, hkv, topk, causal, relu
    (2, 37, 4, 2, 5, True, False),
    (1, 23, 2, 2, 7, False, True),
    (3, 19, 2, 1, 50, True, False),
    (1, 101, 2, 1, 70, True, False),
]


@pytest.mark.parametrize("lq,lk,hq,hkv,topk,causal,relu", TOPK_CASES)
def test_topk_fast_decode_matches_the_float64_oracle(lq, lk, hq, hkv, topk, causal, relu):
    q, k, v = _inputs(lq, lk, hq, hkv, seed=lq + lk)
    got = td.topk_fast_decode(q, k, v, causal=causal, relu=relu, topk=topk, float_scores=False)
    kw = dict(causal=causal, activation="relu" if relu else "softmax", topk=topk)
    want = with_repeated_kv(reference_attention)(q.double(), k.double(), v.double(), **kw)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


def test_topk_fast_decode_through_the_radix_select_matches_the_float64_oracle(monkeypatch):
    # The step with its row top-k split over 3 programs a row (chunks of 16 of 45 keys), causal rows ending in
    # -inf scores, grouped-query heads.
    _radix_select(monkeypatch)
    q, k, v = _inputs(3, 45, 2, 1, seed=9)
    got = td.topk_fast_decode(q, k, v, causal=True, relu=False, topk=20, float_scores=False)
    want = with_repeated_kv(reference_attention)(q.double(), k.double(), v.double(), causal=True, topk=20)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


def test_topk_fast_decode_bfloat16_ranks_as_the_cpu_path():
    # float_scores=True: float32 ranking (bf16 x bf16 products are exact in fp32), the keys of the float64 oracle.
    q, k, v = _inputs(2, 45, 4, 2, dtype=torch.bfloat16, d=16, dv=8, seed=11)
    got = td.topk_fast_decode(q, k, v, causal=True, relu=False, topk=6, float_scores=True)
    want = with_repeated_kv(reference_attention)(q.double(), k.double(), v.double(), causal=True, topk=6)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    # float_scores=False: the products rounded to bf16, as the CPU decode path ranks (many ties at the 6th score:
    # the kernel keeps the lowest keys, the CPU path those its scan meets first: the same scores either way).
    rows, lk = 2 * 4, 45
    scores, idx = torch.empty(rows, lk, dtype=torch.bfloat16), torch.empty(rows, 6, dtype=torch.int32)
    acc, stats, out = torch.empty(rows, 1, 8), torch.empty(rows, 1, 2), torch.empty(1, 4, 2, 8, dtype=torch.bfloat16)
    td.topk_decode_(q, k, v, scores, idx, td.select_scratch(rows, lk, "cpu"), acc, stats, out, True, False, 32)
    rounded = (q.float() @ k.float().repeat_interleave(2, dim=1).transpose(-2, -1)).bfloat16().view(rows, lk)
    rounded = rounded.masked_fill(torch.ones(2, lk, dtype=torch.bool).triu(lk - 1).repeat(4, 1), float("-inf"))
    assert torch.equal(scores, rounded)
    first = rounded.sort(dim=-1, descending=True, stable=True).indices[:, :6]
    assert torch.equal(idx.long(), first.sort(dim=-1).values)
    with torch.no_grad():
        _, cpu_keys = torch.ops.aten.topk(rounded, 6)
    assert torch.equal(rounded.gather(-1, cpu_keys).sort().values, rounded.gather(-1, idx.long()).sort().values)
    weights = torch.softmax(rounded.double().gather(-1, idx.long()), dim=-1)
    values = v.double().repeat_interleave(2, dim=1).reshape(rows // 2, lk, 8)
    want = torch.stack([weights[r] @ values[r // 2][idx[r].long()] for r in range(rows)]).view(out.shape)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2)


def _radix_select(monkeypatch, chunk: int = 16, prior: int = 2) -> None:
    """Every row top-k through the multi-program radix select, in chunks of ``chunk`` columns (``prior`` chunk
    counts summed a step: a write program past the first ``prior`` chunks loops)."""
    monkeypatch.setattr(td, "ONE_PROGRAM_WIDTH", 0)
    monkeypatch.setattr(td, "SELECT_CHUNK", chunk)
    monkeypatch.setattr(td, "RADIX_CONFIG", dict(td.RADIX_CONFIG, CHUNK=chunk))
    monkeypatch.setattr(td, "PRIOR_CHUNKS", prior)


def _first_n(scores: torch.Tensor, n: int) -> torch.Tensor:
    """The exact top-n columns of each row, ties to the lowest column, ascending; -1 for a pick scored -inf."""
    want = scores.sort(dim=-1, descending=True, stable=True).indices[:, :n].sort(dim=-1).values
    return torch.where(scores.float().gather(-1, want) == float("-inf"), -1, want)


def _tied_rows(rows: int, width: int, seed: int) -> torch.Tensor:
    # Integer scores from a 3-value alphabet (ties at the k-th score in most rows), -0.0 beside +0.0, -inf entries,
    # a row of ties with its few larger scores at its end (picks after ties left out: their place counts only the
    # ties taken) and a last row with fewer finite entries than k (its -inf picks read -1).
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-1, 2, (rows, width), generator=g).float()
    scores[0, ::3] = -0.0
    scores[1, 5:9] = float("-inf")
    scores[2] = 0.0
    scores[2, -6::2] = 1.0
    scores[-1, 3:] = float("-inf")
    return scores


def test_row_topk_is_exact_and_breaks_ties_towards_the_lowest_column(monkeypatch):
    # One program a row, 3 column blocks of 16.
    monkeypatch.setattr(td, "SELECT_CONFIG", dict(td.SELECT_CONFIG, BLOCK=16))
    scores = _tied_rows(4, 41, seed=5)
    assert td.select_chunks(41) == 1 and td.select_scratch(4, 41, "cpu").shape == (4, 0)
    padded = torch.full((4, 10), -7, dtype=torch.int32)  # a guard column after each row: no pick past k
    idx = padded[:, :9]
    td.row_topk(scores, idx, td.select_scratch(4, 41, "cpu"))
    assert torch.equal(idx.long(), _first_n(scores, 9)) and (padded[:, 9] == -7).all()
    assert (idx[3] == -1).sum() == 6


@pytest.mark.parametrize("n", [1, 9, 75])
def test_radix_select_over_many_programs_is_exact_with_ties_across_chunks(monkeypatch, n):
    # 75 columns in 5 chunks of 16 (the last partial), each chunk a program: ties at the n-th score spread over
    # chunks (the lowest columns win across program boundaries), k = 1 and k = the row length; the write programs
    # of chunks 2-4 sum the earlier chunks' counts in two steps.
    _radix_select(monkeypatch)
    scores = _tied_rows(4, 75, seed=n)
    assert td.select_chunks(75) == 5
    scratch = td.select_scratch(4, 75, "cpu")
    assert scratch.shape == (4, 4 * 256 + 2 * 5) and not scratch.any()
    padded = torch.full((4, n + 1), -7, dtype=torch.int32)  # a guard column after each row: no pick past n
    idx = padded[:, :n]
    td.row_topk(scores, idx, scratch)
    assert torch.equal(idx.long(), _first_n(scores, n))
    assert (padded[:, n] == -7).all()
    # the histograms count each pass's candidates: pass 0 every column of the row
    assert torch.equal(scratch[:, :256].sum(dim=1), torch.full((4,), 75, dtype=torch.int32))


def test_radix_select_ranks_distinct_floats_and_bfloat16_exactly(monkeypatch):
    # Random float32 (every digit of the key matters: 4 passes narrow to one key) and bfloat16 scores (the low
    # 16 bits of every key are 0: the last passes keep all candidates), negative and positive.
    _radix_select(monkeypatch, chunk=32)
    g = torch.Generator().manual_seed(7)
    for scores in (torch.randn(2, 100, generator=g), torch.randn(2, 100, generator=g).bfloat16()):
        idx = torch.empty(2, 13, dtype=torch.int32)
        td.row_topk(scores, idx, td.select_scratch(2, 100, "cpu"))
        assert torch.equal(idx.long(), _first_n(scores, 13))


def test_the_row_top_k_takes_one_program_for_short_rows_and_chunks_for_long_ones():
    assert [td.select_chunks(w) for w in (1, td.ONE_PROGRAM_WIDTH, td.ONE_PROGRAM_WIDTH + 1, 131072)] == [
        1,
        1,
        -(-(td.ONE_PROGRAM_WIDTH + 1) // td.SELECT_CHUNK),
        131072 // td.SELECT_CHUNK,
    ]
    assert td.select_scratch(32, 131072, "cpu").shape == (32, 4 * 256 + 2 * 64)


def test_cuda_decode_steps_take_the_triton_ops_under_fake_tensors(monkeypatch):
    # --predict --device cuda: fake CPU tensors shaped for CUDA. A decode step of each goes through the ops, whose
    # fake kernels allocate nothing: the step's peak is the buffers the wrapper allocates, to the byte.
    calls = []
    for name in ("page_topk_decode", "topk_fast_decode"):
        real = getattr(td, name)
        monkeypatch.setattr(td, name, lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
    b, hq, hkv, lk, d = 1, 32, 8, 4096, 128
    with FakeTensorMode(), hardware.target("cuda"), torch.no_grad():
        q = torch.empty(b, hq, 1, d, dtype=torch.bfloat16)
        k = torch.empty(b, hkv, lk, d, dtype=torch.bfloat16)
        summaries = page_summaries(k, 16)
        with LiveBytes(q, k, summaries) as tracker:
            out = page.fn(q, k, k, causal=True, page_size=16, token_budget=256, summaries=summaries)
        rows, pages, n = b * hkv, lk // 16, 256 // 16
        assert pages <= td.ONE_PROGRAM_WIDTH  # one program a row: no select scratch
        splits, _ = td._splits(rows, n + 1, td.CHUNK_KEYS // 16)
        scratch = rows * pages * 4 + rows * n * 4 + b * hq * splits * (d + 2) * 4
        assert tracker.peak == scratch + out.nbytes
        with LiveBytes(q, k) as tracker:
            out = fast(q, k, k, causal=True, topk=256)
        rows = b * hq
        splits, _ = td._splits(rows, 256, td.GATHER_CHUNK)
        select = rows * (4 * 256 + 2 * -(-lk // td.SELECT_CHUNK)) * 4  # the radix select's histograms and counts
        assert lk > td.ONE_PROGRAM_WIDTH
        assert tracker.peak == rows * lk * 2 + rows * 256 * 4 + select + rows * splits * (d + 2) * 4 + out.nbytes
    assert calls == ["page_topk_decode", "topk_fast_decode"]
    assert out.shape == (b, hq, 1, d) and out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "name, call, why",
    [
        ("page_topk", dict(page_size=200), "page_size > 128"),
        ("page_topk", dict(lq=65), "not a decode step"),
        ("page_topk", dict(hq=34, hkv=2), "more than 16 query heads per K/V head"),
        ("topk_fast", dict(key_padding_mask=torch.zeros(1, 300, dtype=torch.bool)), "key padding"),
        ("topk_fast", dict(d=257), "head size > 256"),
        ("topk_fast", dict(dtype=torch.float64), "dtype torch.float64"),
    ],
)
def test_what_the_decode_kernels_leave_to_torch(name, call, why):
    call = dict(call)
    lq, hq, hkv, d = call.pop("lq", 1), call.pop("hq", 4), call.pop("hkv", 2), call.pop("d", 8)
    dtype = call.pop("dtype", torch.float32)

    def check():
        q, k = torch.empty(1, hq, lq, d, dtype=dtype), torch.empty(1, hkv, 300, d, dtype=dtype)
        if name == "page_topk":
            options = dict(causal=True, page_size=16, group_pages=True, chunk_size=64) | call
            return td.page_topk_unsupported(q, k, k, **options)
        return td.topk_fast_unsupported(q, k, k, key_padding_mask=call.get("key_padding_mask"))

    assert check() == "not a CUDA tensor"
    with FakeTensorMode(), hardware.target("cuda"):
        assert check() == why


def test_decode_kernels_fall_back_with_one_warning_or_silently_when_disabled(monkeypatch, recwarn):
    with FakeTensorMode(), hardware.target("cuda"):
        q = torch.empty(1, 2, 1, 8)
        monkeypatch.setenv(tk.SWITCH_ENV, "0")
        assert td.topk_fast_unsupported(q, q, q, key_padding_mask=None) == "disabled by TOPK_BENCH_TRITON=0"
        assert not recwarn.list
        monkeypatch.delenv(tk.SWITCH_ENV)  # page_topk's decode steps: the kernels by default
        monkeypatch.setattr(launch, "triton_import_failure", lambda: "triton not importable (ImportError: x)")
        launch.warn_torch_path.cache_clear()
        try:
            with pytest.warns(RuntimeWarning, match=r"page_topk: triton not importable \(ImportError: x\)") as rec:
                for _ in range(3):
                    page.fn(q, q, q, causal=True, page_size=4, token_budget=8)
            assert len(rec) == 1
        finally:
            launch.warn_torch_path.cache_clear()


def test_page_topk_code_path_says_triton_on_cuda():
    import triton

    from topk_bench.attention import provenance

    cuda = provenance.parse(provenance.code_path("page_topk", device="cuda", dtype=torch.bfloat16))
    # the kernels take decode steps; the rest runs the torch path named beside
    # (topk_bench/attention/shared/cuda_torch.py)
    assert cuda == {"triton_kernels": f"triton:{triton.__version__}", "cuda_torch": "batched"}
    assert "triton_kernels" not in provenance.parse(
        provenance.code_path("page_topk", device="cpu", dtype=torch.float32)
    )


def test_the_implementations_dispatch_their_decode_steps_to_the_kernels(monkeypatch):
    # A CUDA target (real CPU tensors: the kernels run in the interpreter) through each implementation's own entry
    # point: the hooks take decode steps only (not a call with gradients), with the same output as the torch path.
    calls = []
    for name in ("page_topk_decode", "topk_fast_decode"):
        real = getattr(td, name)
        monkeypatch.setattr(td, name, lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
    q, k, v = _inputs(1, 41, 4, 2, seed=2)
    options = dict(causal=True, page_size=4, token_budget=12)
    with torch.no_grad():
        want_page, want_fast = page.fn(q, k, v, **options), fast(q, k, v, causal=True, topk=5)
        with hardware.target("cuda"):
            got_page, got_fast = page.fn(q, k, v, **options), fast(q, k, v, causal=True, topk=5)
            with pytest.raises(ValueError, match=r"summaries must be \[B, Hkv, P, 2, d\]"):
                page.fn(q, k, v, summaries=page_summaries(k, 8), **options)
    assert calls == ["page_topk_decode", "topk_fast_decode"]
    torch.testing.assert_close(got_page, want_page, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got_fast, want_fast, rtol=2e-5, atol=2e-5)
    with hardware.target("cuda"):
        page.fn(q, k, v.requires_grad_(), **options)  # gradients recorded: the torch path
    assert len(calls) == 2


@pytest.mark.parametrize("radix", [False, True], ids=["one program a row", "radix select, 2 chunks"])
def test_page_table_ties_go_to_the_lowest_pages(monkeypatch, radix):
    # Every page holds the same 4 keys: every eligible page has the same bound, so the table is the first n of them
    # (causal: pages before the own one, 7), the picks in ascending order; a second K/V head's pages differ.
    if radix:
        _radix_select(monkeypatch, chunk=4)
    q, k, v = _inputs(1, 29, 2, 2, seed=4)
    k[:, 0] = k[:, 0, :4].repeat(1, 8, 1)[:, :29]
    rows, n = 2, 3
    bounds, table = torch.empty(rows, 8), torch.empty(rows, n, dtype=torch.int32)
    acc, stats, out = torch.empty(rows, 1, 6), torch.empty(rows, 1, 2), torch.empty(1, 2, 1, 6)
    select = td.select_scratch(rows, 8, "cpu")
    td.page_decode_(q, k, v, page_summaries(k, 4), bounds, table, select, acc, stats, out, True, 4, 16)
    assert bounds[0, :7].unique().numel() == 1 and bounds[0, 7] == float("-inf")
    assert table[0].tolist() == [0, 1, 2]
    keep = page.selection(q.double(), k.double(), causal=True, page_size=4, token_budget=12)
    assert set(table[1].tolist()) == set(
        keep[0, 1, 0].view(-1).nonzero().div(4, rounding_mode="floor").unique()[:-1].tolist()
    )
