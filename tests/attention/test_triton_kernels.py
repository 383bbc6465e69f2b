"""topk_fast's Triton kernels, run by Triton's interpreter on CPU tensors: the float64 oracle's outputs and gradients,
the exact selection with its tie rule, and the CUDA dispatch (fake tensors) that ``--predict --device cuda`` takes."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("triton", reason="triton is not importable (the dev extra installs it)")

import topk_bench.attention
from attention_reference import qkv_gqa, reference_attention, with_repeated_kv
from topk_bench.attention.kernels import triton as tk
from topk_bench.attention.kernels.triton import launch
from topk_bench.attention.shared import hardware

pytestmark = pytest.mark.usefixtures("single_thread", "kernels_forced")


@pytest.fixture
def kernels_forced(monkeypatch):
    """TOPK_BENCH_TRITON=1: the kernels wherever they take the call (unset, the measured defaults keep
    topk_fast's training calls on the torch path: tests/attention/test_triton_defaults.py)."""
    monkeypatch.setenv(tk.SWITCH_ENV, "1")


fast = topk_bench.attention.get("topk_fast")


def _run(q, k, v, **kw):
    """Output and the three gradients of the Triton path (``dout`` a fixed ramp, as the oracle's)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = tk.topk_attention(*leaves, **kw)
    g = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape).to(out.dtype)
    return (out, *torch.autograd.grad(out, leaves, g))


def _oracle(q, k, v, *, causal, relu, topk, groups):
    """Float64 dense top-k attention of the same (rounded) inputs, K/V repeated to the query heads for GQA."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    fn = with_repeated_kv(reference_attention) if groups > 1 else reference_attention
    out = fn(*leaves, causal=causal, activation="relu" if relu else "softmax", topk=topk)
    g = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
    return (out, *torch.autograd.grad(out, leaves, g))


def _close(got, want, atol):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=atol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


# Odd lengths both ways, k below and above the keys (k >= Lk keeps all; causal rows with fewer allowed keys than k
# pick masked ones at weight 0), more query rows than keys (causal: rows with no key give 0), GQA (2 query heads per
# K/V head), several key blocks of the selection (Lk > K_PAD = 16: merges and skipped blocks) and k = K_PAD. Tiny:
# the interpreter takes ~0.3 s per sort of a 16 x 16 block.
CASES = [
    # lq, lk, topk, hq, hkv, causal, relu
    (7, 11, 3, 2, 2, False, False),
    (7, 11, 3, 2, 2, True, True),
    (9, 5, 20, 1, 1, True, False),
    (5, 37, 4, 2, 1, True, False),
    (5, 19, 16, 2, 1, False, True),
]


@pytest.mark.parametrize("lq,lk,topk,hq,hkv,causal,relu", CASES)
def test_float32_matches_the_float64_oracle(lq, lk, topk, hq, hkv, causal, relu):
    q, k, v = (t.detach().float() for t in qkv_gqa(lq, lk, hq, hkv, b=1, seed=lq * lk + topk))
    kw = dict(causal=causal, relu=relu, topk=topk)
    got = _run(q, k, v, groups=hq // hkv, float_scores=False, **kw)
    _close(got, _oracle(q, k, v, groups=hq // hkv, **kw), atol=2e-5)


@pytest.mark.parametrize("d, dv", [(40, 24), (128, 128)])
def test_head_dim_slices_match_the_float64_oracle(d, dv):
    # The selection sums its score tile over BLOCK_D-wide slices of the head: 40 = 16 + 16 + 8 (a partial last
    # slice, masked), 128 = Llama-3-8B's 8 slices; the gathered kernels take d = 128 in CHUNK = 16 rows.
    q, k, v = (t.detach().float() for t in qkv_gqa(7, 21, 2, 1, d=d, dv=dv, b=1, seed=d))
    assert d > tk.BLOCK_D
    kw = dict(causal=True, relu=False, topk=5)
    got = _run(q, k, v, groups=2, float_scores=False, **kw)
    _close(got, _oracle(q, k, v, groups=2, **kw), atol=5e-5)


def test_k128_matches_the_float64_oracle():
    # topk_fast's default k = 128: K_PAD = 128, two key blocks (a merge), two head slices, non-causal.
    q, k, v = (t.detach().float() for t in qkv_gqa(3, 200, 1, 1, d=32, dv=16, b=1, seed=128))
    assert tk.select_config(100, 32)["K_PAD"] == 128
    kw = dict(causal=False, relu=False, topk=100)
    _close(_run(q, k, v, groups=1, float_scores=False, **kw), _oracle(q, k, v, groups=1, **kw), atol=2e-5)


@pytest.mark.slow
def test_k200_selection_cuts_a_512_key_buffer_exactly():
    # k in 129..256: K_PAD = 256, buffers of CAP = 512 keys. 600 keys: the buffer fills after 8 blocks of 64 and is
    # cut before the 9th, then once more at the end; the picks are the stable sort's first 200. Slow: 9 s in the
    # interpreter at a load of 2, 54 s at 5 (a cut reads 8 chunks a pass; the final sort of 16 x 256).
    config = tk.select_config(200, 16)
    assert (config["K_PAD"], config["CAP"]) == (256, 512)
    q, k = (t.detach().float()[0] for t in qkv_gqa(3, 600, 1, 1, d=16, dv=16, b=1, seed=200)[:2])
    assert torch.equal(_select(q, k, 200), _stable_top(q @ k.transpose(-2, -1), 200))


def test_bfloat16_with_float32_ranking_matches_the_float64_oracle():
    # bf16 inputs, fp32 accumulation everywhere; float_scores ranks by the exact products (bf16 x bf16 is exact in
    # fp32), the keys the oracle keeps. The gradients come back in bf16.
    q, k, v = (t.detach().bfloat16() for t in qkv_gqa(9, 21, 2, 1, d=16, dv=8, b=1, seed=5))
    kw = dict(causal=True, relu=False, topk=6)
    got = _run(q, k, v, groups=2, float_scores=True, **kw)
    assert all(t.dtype == torch.bfloat16 for t in got)
    _close(got, _oracle(q, k, v, groups=2, **kw), atol=2e-2)


def test_bfloat16_rounded_ranking_picks_the_cpu_paths_keys():
    # float_scores=False ranks by the product rounded to bf16, as topk_fast's CPU path: the same keys, and outputs
    # within a bf16 rounding (the CPU path's bags sum bf16 weights, the kernel sums fp32 ones).
    from topk_bench.attention.methods import topk_fast

    q, k, v = (t.detach().bfloat16() for t in qkv_gqa(11, 29, 1, 1, d=16, dv=8, b=1, seed=7))
    idx = torch.empty(1, 11, 5, dtype=torch.int32)
    tk.topk_select_(q[0], k[0], idx, True, True, 1)
    _, want = topk_fast._select(q[0], k[0], True, 5, 4, float_scores=False)
    assert torch.equal(idx.sort(dim=-1).values, want.sort(dim=-1).values)
    got = tk.topk_attention(q, k, v, causal=True, relu=False, topk=5, groups=1, float_scores=False)
    torch.testing.assert_close(
        got.float(), fast(q, k, v, causal=True, topk=5, chunk_size=4).float(), rtol=2e-2, atol=1e-2
    )


def test_selection_is_exact_and_breaks_ties_towards_the_lowest_key():
    # Integer scores from a 2-value alphabet: most rows have many ties at the k-th score. The kernel returns each
    # row's top-k by score descending, ties by key index ascending: a stable descending sort's first k.
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-1, 2, (2, 9, 16), generator=g).float()
    k = torch.randint(-1, 2, (2, 24, 16), generator=g).float()
    idx = torch.empty(2, 9, 7, dtype=torch.int32)
    tk.topk_select_(q, k, idx, False, False, 1)
    scores = q @ k.transpose(-2, -1)
    want = scores.sort(dim=-1, descending=True, stable=True).indices[..., :7]
    assert (scores.unsqueeze(-1) == scores.gather(-1, want).unsqueeze(-2)).any()  # ties do occur
    heads = torch.arange(2).view(2, 1, 1) * 24
    assert torch.equal(idx.long(), want + heads)


def test_negative_zero_ties_with_zero():
    # -0.0 and +0.0 are one score: the lower key wins whatever the sign of its zero.
    q = torch.zeros(1, 1, 16)
    q[..., 0] = 1.0
    k = torch.zeros(1, 4, 16)
    k[0, :, 0] = torch.tensor([-1.0, -0.0, 0.0, -2.0])
    idx = torch.empty(1, 1, 2, dtype=torch.int32)
    tk.topk_select_(q, k, idx, False, False, 1)
    assert idx.flatten().tolist() == [1, 2]


def _select(q, k, kk, causal=False, round_scores=False, scratch=None):
    """The kernel's picks (global key rows) for ``q [heads, Lq, D]``, ``k [heads, Lk, D]`` (one query head per K/V
    head)."""
    idx = torch.empty(q.shape[0], q.shape[1], kk, dtype=torch.int32)
    tk.topk_select_(q, k, idx, causal, round_scores, 1, scratch)
    return idx.long() - torch.arange(q.shape[0]).view(-1, 1, 1) * k.shape[1]


def _stable_top(scores, kk, causal=False):
    """Each row's top-``kk`` by score descending, ties to the lowest key (a stable sort); causal: bottom-right."""
    if causal:
        lq, lk = scores.shape[-2:]
        allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.sort(dim=-1, descending=True, stable=True).indices[..., :kk]


def _ramp_keys(lk, score_of_column, d=16):
    """``q`` = e0 and ``k[j]`` = score_of_column(j) e0: the score of key j is exactly ``score_of_column(j)``."""
    q = torch.zeros(1, 2, d)
    q[..., 0] = 1.0
    k = torch.zeros(1, lk, d)
    k[0, :, 0] = score_of_column(torch.arange(lk)).float()
    return q, k


def test_candidate_buffers_overflow_and_are_cut_several_times():
    # Scores rising away from the diagonal: the walk (the diagonal back to key 0) meets ever better keys, every one
    # beats the threshold and is appended. k = 3: K_PAD = 16, a buffer of CAP = 128 keys a row; 330 keys in 6 blocks
    # of 64: full after 2, cut before the 3rd and the 5th (3 + 64 + 64 > 128), and once more at the end.
    config = tk.select_config(3, 16)
    assert (config["K_PAD"], config["CAP"], config["BLOCK_N"]) == (16, 128, 64)
    q, k = _ramp_keys(330, lambda j: -j)
    assert _select(q, k, 3).tolist() == [[[0, 1, 2]] * 2]


def test_ties_at_the_threshold_across_cuts_go_to_the_lowest_keys():
    # Scores in runs of 10 equal values, rising towards key 0: k = 15 ends inside a run (all 10 of run 0, then keys
    # 10..14 of run 1), and every cut finds more than k keys at or above its k-th score (the column bits decide).
    q, k = _ramp_keys(200, lambda j: -(j // 10))
    assert torch.equal(_select(q, k, 15)[0, 0], torch.arange(15))
    # The same on integer scores of a 3-value alphabet, 200 keys (cuts with ties at every threshold), causal too.
    g = torch.Generator().manual_seed(11)
    q = torch.randint(-1, 2, (1, 16, 16), generator=g).float()
    k = torch.randint(-1, 2, (1, 200, 16), generator=g).float()
    for causal in (False, True):
        assert torch.equal(_select(q, k, 20, causal), _stable_top(q @ k.transpose(-2, -1), 20, causal))


@pytest.mark.parametrize("programs", [1, tk.SELECT_PROGRAMS])
def test_the_walk_from_the_diagonal_covers_both_sides_when_not_causal(monkeypatch, programs):
    # More query rows than keys, not causal: tile 0's diagonal is key 16 + (150 - 48) = 118, so its walk goes back to
    # key 0, then forwards over keys 118..149 (where its rows' best keys are put). One program walking every tile in
    # turn reuses its buffer: garbage left in it (here: the largest key there is) must never be read.
    monkeypatch.setattr(tk, "SELECT_PROGRAMS", programs)
    q, k = (t.detach().float() for t in qkv_gqa(48, 150, 1, 1, d=16, dv=16, b=1, seed=21)[:2])
    q, k = q[0], k[0]
    k[:, 140:] += q.mean(dim=1, keepdim=True)  # the best keys past the first tile's diagonal
    scratch = tk.candidate_buffers(q, 10).fill_(2**63 - 1)
    assert scratch.shape == (min(programs, 3), tk.BLOCK_M, 128)
    scores = q @ k.transpose(-2, -1)
    want = _stable_top(scores, 10)
    assert (want[:, :16] >= 118).any()  # tile 0 picks keys ahead of its diagonal
    assert torch.equal(_select(q, k, 10, scratch=scratch), want)


def test_a_scratch_of_another_shape_is_refused():
    q = torch.zeros(1, 16, 16)
    idx = torch.empty(1, 16, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"scratch must be contiguous int64 \[programs, 16, 128\]"):
        tk.topk_select_(q, q, idx, False, False, 1, torch.empty(1, 16, 64, dtype=torch.int64))


@pytest.mark.parametrize("causal", [False, True])
def test_k_equal_to_the_keys_returns_every_key_by_score(causal):
    # k = Lk = 37 (K_PAD = 64): all keys, by score descending; causal rows seeing fewer keys pick the masked ones
    # (score -inf) last, lowest key first.
    q, k = (t.detach().float()[0] for t in qkv_gqa(5, 37, 1, 1, d=16, dv=16, b=1, seed=37)[:2])
    want = _stable_top(q @ k.transpose(-2, -1), 37, causal)
    assert torch.equal(_select(q, k, 37, causal), want)


def test_bfloat16_rounded_ranking_ties_across_cuts_exactly():
    # Inputs in quarters: every product and fp32 sum is exact, then rounded to bf16 (8 significant bits) as the
    # kernel ranks half inputs: many scores tie after rounding. 200 keys fill a 128-key buffer (k = 20): cuts with
    # ties at the threshold; the picks are the stable sort of the rounded scores.
    g = torch.Generator().manual_seed(16)
    q = (torch.randint(-8, 9, (1, 16, 16), generator=g) / 4).bfloat16()
    k = (torch.randint(-8, 9, (1, 200, 16), generator=g) / 4).bfloat16()
    rounded = (q.float() @ k.float().transpose(-2, -1)).bfloat16().float()
    assert (rounded != q.float() @ k.float().transpose(-2, -1)).any()  # rounding does make ties
    for causal in (False, True):
        assert torch.equal(_select(q, k, 20, causal, round_scores=True), _stable_top(rounded, 20, causal))


def test_the_selection_scratch_is_allocated_by_torch_and_bounded():
    # --predict --device cuda sees the candidate buffers: the training forward's peak is the indices plus the larger
    # of the scratch (alive during the selection) and the output with its log-sum-exp, to the byte. The scratch is
    # one [BLOCK_M, CAP] int64 buffer per program: at most SELECT_PROGRAMS, whatever the length.
    from live_bytes import LiveBytes

    heads, lq, d, kk = 4, 300, 64, 128
    with FakeTensorMode(), hardware.target("cuda"):
        q, k, v = (torch.randn(1, heads, lq, d, requires_grad=True) for _ in range(3))
        with LiveBytes(q, k, v) as tracker:
            out = tk.topk_attention(q, k, v, causal=True, relu=False, topk=kk, groups=1, float_scores=False)
        scratch = heads * -(-lq // 16) * 16 * 256 * 8
        assert tk.candidate_buffers(q[0], kk).nbytes == scratch
        assert tracker.peak == heads * lq * kk * 4 + max(scratch, out.nbytes + heads * lq * 4)
        huge = torch.empty(32, 65536, d)
        assert tk.candidate_buffers(huge, kk).nbytes == tk.SELECT_PROGRAMS * 16 * 256 * 8  # 16 MiB


@pytest.mark.parametrize("topk, d", [(64, 64), (128, 64), (tk.MAX_TOPK, tk.MAX_TRAINING_HEAD_DIM)])
def test_cuda_calls_take_the_triton_ops_under_fake_tensors(monkeypatch, topk, d):
    # --predict --device cuda: fake CPU tensors shaped for CUDA. The training call goes through the Triton ops
    # (whose fake kernels allocate nothing), with gradients of the inputs' shapes and dtypes: BERT-base's head with
    # k = 64 and the default k = 128, and the largest k and head (Llama-3-8B's) the kernels take.
    calls = []
    monkeypatch.setattr(tk, "topk_attention", lambda *a, **kw: calls.append(kw) or _real(*a, **kw))
    with FakeTensorMode(), hardware.target("cuda"):
        q = torch.randn(1, 4, 300, d, requires_grad=True)
        k = torch.randn(1, 2, 300, d, requires_grad=True)
        v = torch.randn(1, 2, 300, 32, requires_grad=True)
        out = fast(q, k, v, causal=True, topk=topk, chunk_size=64)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert calls and calls[0]["groups"] == 2 and calls[0]["topk"] == topk
    assert out.shape == (1, 4, 300, 32)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


_real = tk.topk_attention


@pytest.mark.parametrize(
    "kw, why",
    [
        (dict(dropout=0.1), "dropout"),
        (dict(key_padding_mask=torch.zeros(1, 300, dtype=torch.bool)), "key padding"),
        (dict(topk=tk.MAX_TOPK + 1), f"topk > {tk.MAX_TOPK}"),
        (dict(head_size=tk.MAX_TRAINING_HEAD_DIM + 1), f"head size > {tk.MAX_TRAINING_HEAD_DIM}"),
    ],
)
def test_what_the_triton_path_leaves_to_torch(kw, why):
    kw = dict(kw)
    d = kw.pop("head_size", 8)
    q = torch.empty(1, 2, 300, d)
    options = dict(topk=32, dropout=0.0, key_padding_mask=None) | kw
    assert tk.unsupported(q, q, q, **options) == "not a CUDA tensor"
    with FakeTensorMode(), hardware.target("cuda"):
        q = torch.empty(1, 2, 300, d)
        assert tk.unsupported(q, q, q, **options) == why


def test_a_cuda_machine_without_triton_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(
        launch, "triton_import_failure", lambda: "triton not importable (ModuleNotFoundError: No module named 'x')"
    )
    launch.warn_torch_path.cache_clear()
    try:
        with FakeTensorMode(), hardware.target("cuda"):
            q = torch.empty(1, 2, 30, 8)
            with pytest.warns(RuntimeWarning, match=r"No module named 'x'\); CUDA runs the torch path") as record:
                for _ in range(3):
                    fast(q, q, q, causal=True, topk=4, chunk_size=8)
        assert len(record) == 1
        assert tk.status("topk_fast") == "torch:triton not importable (ModuleNotFoundError: No module named 'x')"
    finally:
        launch.warn_torch_path.cache_clear()


def test_disabled_on_purpose_falls_back_silently(monkeypatch, recwarn):
    monkeypatch.setenv(tk.SWITCH_ENV, "0")
    with FakeTensorMode(), hardware.target("cuda"):
        q = torch.empty(1, 2, 30, 8)
        assert tk.unsupported(q, q, q, topk=4, dropout=0.0, key_padding_mask=None) == "disabled by TOPK_BENCH_TRITON=0"
    assert tk.status("topk_fast") == "torch:disabled by TOPK_BENCH_TRITON=0"
    assert not recwarn.list


def test_code_path_says_triton_on_cuda_only(monkeypatch):
    import triton

    from topk_bench.attention import provenance

    cuda = provenance.parse(provenance.code_path("topk_fast", device="cuda", dtype=torch.bfloat16))
    assert cuda["triton_kernels"] == f"triton:{triton.__version__}"
    assert "triton_kernels" not in provenance.parse(
        provenance.code_path("topk_fast", device="cpu", dtype=torch.float32)
    )
    monkeypatch.setenv(tk.SWITCH_ENV, "0")
    cuda = provenance.parse(provenance.code_path("topk_fast", device="cuda", dtype=torch.float32))
    assert cuda["triton_kernels"] == "torch:disabled by TOPK_BENCH_TRITON=0"
