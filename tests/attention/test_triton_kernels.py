"""topk_fast's Triton kernels, run by Triton's interpreter on CPU tensors: the float64 oracle's outputs and gradients,
the exact selection with its tie rule, and the CUDA dispatch (fake tensors) that ``--predict --device cuda`` takes."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("triton", reason="triton is not importable (the dev extra installs it)")

import implementations
from attention_reference import qkv_gqa, reference_attention, with_repeated_kv
from implementations import hardware
from implementations import triton_kernels as tk

pytestmark = pytest.mark.usefixtures("single_thread", "kernels_forced")


@pytest.fixture
def kernels_forced(monkeypatch):
    """TOPK_BENCH_TRITON=1: the kernels wherever they take the call (unset, the measured defaults keep
    topk_fast's training calls on the torch path: tests/attention/test_triton_defaults.py)."""
    monkeypatch.setenv(tk.DISABLE_ENV, "1")


fast = implementations.get("topk_fast")


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
    from implementations import topk_fast

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


@pytest.mark.parametrize("topk, d", [(64, 64), (128, 64), (tk.MAX_TOPK, tk.MAX_HEAD_DIM)])
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
        (dict(head_size=tk.MAX_HEAD_DIM + 1), f"head size > {tk.MAX_HEAD_DIM}"),
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
        tk, "_import_failure", lambda: "triton not importable (ModuleNotFoundError: No module named 'x')"
    )
    tk._warn_fallback.cache_clear()
    try:
        with FakeTensorMode(), hardware.target("cuda"):
            q = torch.empty(1, 2, 30, 8)
            with pytest.warns(RuntimeWarning, match=r"No module named 'x'\); CUDA runs the torch path") as record:
                for _ in range(3):
                    fast(q, q, q, causal=True, topk=4, chunk_size=8)
        assert len(record) == 1
        assert tk.status("topk_fast") == "torch:triton not importable (ModuleNotFoundError: No module named 'x')"
    finally:
        tk._warn_fallback.cache_clear()


def test_disabled_on_purpose_falls_back_silently(monkeypatch, recwarn):
    monkeypatch.setenv(tk.DISABLE_ENV, "0")
    with FakeTensorMode(), hardware.target("cuda"):
        q = torch.empty(1, 2, 30, 8)
        assert tk.unsupported(q, q, q, topk=4, dropout=0.0, key_padding_mask=None) == "disabled by TOPK_BENCH_TRITON=0"
    assert tk.status("topk_fast") == "torch:disabled by TOPK_BENCH_TRITON=0"
    assert not recwarn.list


def test_code_path_says_triton_on_cuda_only(monkeypatch):
    import triton

    from implementations import provenance

    cuda = provenance.parse(provenance.code_path("topk_fast", device="cuda", dtype=torch.bfloat16))
    assert cuda["triton_kernels"] == f"triton:{triton.__version__}"
    assert "triton_kernels" not in provenance.parse(
        provenance.code_path("topk_fast", device="cpu", dtype=torch.float32)
    )
    monkeypatch.setenv(tk.DISABLE_ENV, "0")
    cuda = provenance.parse(provenance.code_path("topk_fast", device="cuda", dtype=torch.float32))
    assert cuda["triton_kernels"] == "torch:disabled by TOPK_BENCH_TRITON=0"
