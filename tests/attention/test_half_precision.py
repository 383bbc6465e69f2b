"""float16 / bfloat16 inputs on the CPU: outputs in the input dtype, close to float32 on the
same values; top-k selections equal those of the same values in float32; FakeTensorMode."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from topk_bench import attention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

HALF = [torch.bfloat16, torch.float16]
# Options that make chunking and selection happen on the small inputs below.
CASES = [
    ("vanilla", {}),
    ("sdpa", {}),
    ("qchunk", {"chunk_size": 3}),
    ("topk", {"chunk_size": 3, "topk": 4}),
    ("topk_sparse", {"chunk_size": 3, "topk": 4}),
    ("topk_fast", {"chunk_size": 3, "topk": 4}),
    ("performer", {"nb_features": 16, "chunk_size": 3}),
]
IDS = [name for name, _ in CASES]
SELECTING = ["topk", "topk_sparse", "topk_fast"]
# What makes each rank half inputs by float32 scores (topk_fast ranks by the half product unless asked).
FLOAT32_RANKING = {"topk": {}, "topk_sparse": {}, "topk_fast": {"float_scores": True}}


def half_inputs(lq, lk, hq, hkv, dtype, d=8, dv=6, b=2, seed=0):
    """Random q (scaled by 1/sqrt(d), as callers do), k, v, rounded to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, hq, lq, d, generator=g) / math.sqrt(d)).to(dtype)
    k = torch.randn(b, hkv, lk, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, lk, dv, generator=g).to(dtype)
    return q, k, v


def tolerance(q, k, v, activation, dtype):
    """Bound on |out(half) - out(float32 of the same values)|, from the rounding steps.

    Let u be the unit roundoff of ``dtype`` (2^-8 bf16, 2^-11 fp16), V = max|v|, S the
    largest |score| and W the largest row sum of the (dense) weights (1 for softmax).
    The output is rounded once: u·W·V. The weights are rounded to the input dtype for
    the product with V: u·W·V. Dense implementations round each score once in their
    half GEMM (|ds_j| <= u·S): to first order a softmax output moves by the covariance,
    under the weights, of ds and v, at most u·S·V; a relu output by sum_j |ds_j|·V <= u·W·V.
    Products and sums accumulate in float32 (2^-24, negligible); top-k selects in float32,
    so it keeps the same keys. 1.5x that sum for second-order terms.
    """
    u = torch.finfo(dtype).eps / 2
    scores = q.double() @ k.double().repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3).transpose(-2, -1)
    v_max = v.abs().max().item()
    if activation == "softmax":
        return 1.5 * (2 + scores.abs().max().item()) * u * v_max
    return 1.5 * 3 * u * scores.relu().sum(dim=-1).max().item() * v_max


def _options(name, options, d=8):
    if name == "performer":  # one projection for both dtypes: the estimator itself must not change
        torch.manual_seed(0)
        return {**options, "projection": attention.methods.performer.draw_projection(16, d)}
    return options


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_half_output_is_close_to_float32_output(name, options, activation, causal, dtype):
    if activation not in attention.spec(name).activations:
        pytest.skip(f"{name} does not support {activation}")
    fn = attention.get(name)
    options = _options(name, options)
    q, k, v = half_inputs(5, 9, 4, 2, dtype)
    q.requires_grad_()
    want = fn(q.float(), k.float(), v.float(), causal=causal, activation=activation, **options)
    got = fn(q, k, v, causal=causal, activation=activation, **options)
    assert got.dtype == dtype and got.shape == want.shape
    tol = tolerance(q, k, v, activation, dtype)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)
    # The tolerance is not vacuous: it is a few hundredths of the outputs' scale.
    assert tol < 0.1 * want.abs().max()
    got.float().pow(2).sum().backward()
    assert q.grad.dtype == dtype and torch.isfinite(q.grad).all()
    if name in ("topk", "topk_fast"):  # the decode path (no gradient, chunk_size >= Lq)
        with torch.no_grad():
            decoded = fn(q, k, v, causal=causal, activation=activation, **{**options, "chunk_size": 64})
        assert decoded.dtype == dtype
        torch.testing.assert_close(decoded.float(), want, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_softmax_normaliser_of_a_long_row_is_taken_in_float32(name, options, dtype):
    # 2048 nearly equal weights: a normaliser accumulated in half precision stalls once the
    # running sum's spacing exceeds a term (bf16 near 0.25: 2^-10 > 1/2048), which would
    # make the output several times larger than u; float32 statistics keep it within u.
    options = {**_options(name, options, d=4), **({"topk": 2048} if "topk" in options else {})}
    q, k, v = half_inputs(2, 2048, 1, 1, dtype, d=4, dv=4, b=1, seed=1)
    q = q * 0.1  # scores within +-0.5
    v = v.abs() + 1  # every value in [1, 5): the output is a weighted mean of them
    fn = attention.get(name)
    want = fn(q.float(), k.float(), v.float(), causal=False, **options)
    got = fn(q, k, v, causal=False, **options).float()
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance(q, k, v, "softmax", dtype))


def selected(out):
    """Which keys a row attends, read from the output with V = identity: ``out[..., j]`` is key j's weight."""
    return out != 0


def float32_topk_sets(q, k, topk):
    """The top-k key sets of every row from the same values in float64, and the smallest margin
    between a row's k-th and (k+1)-th score (guards against near-ties)."""
    groups = q.shape[-3] // k.shape[-3]
    scores = q.double() @ k.double().repeat_interleave(groups, dim=-3).transpose(-2, -1)
    ranked = scores.sort(dim=-1, descending=True).values
    sets = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.topk(topk, dim=-1).indices, True)
    return sets, (ranked[..., topk - 1] - ranked[..., topk]).min().item(), scores


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("grad", [True, False], ids=["train", "decode"])
@pytest.mark.parametrize("name", SELECTING)
def test_half_inputs_select_the_keys_of_float32(name, grad, dtype):
    lk, topk = 512, 16
    q, k, _ = half_inputs(4, lk, 4, 2, dtype, d=16, seed=2)
    want, margin, scores = float32_topk_sets(q, k, topk)
    # No near-ties: float32 sums of 16 exact products are off by ~1e-6 at most.
    assert margin > 1e-5
    eye = torch.eye(lk, dtype=dtype).expand(2, 2, lk, lk)
    with torch.set_grad_enabled(grad):  # decode: no gradient and chunk_size >= Lq
        out = attention.get(name)(
            q.requires_grad_(grad), k, eye, topk=topk, chunk_size=3 if grad else 64, **FLOAT32_RANKING[name]
        )
    assert torch.equal(selected(out), want)
    # Guards the test: scores rounded to the input dtype would select other keys somewhere.
    if dtype == torch.bfloat16:
        rounded = scores.to(dtype).double()
        assert not torch.equal(torch.zeros_like(want).scatter_(-1, rounded.topk(topk, dim=-1).indices, True), want)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_half_inputs_under_fake_tensors(name, options, dtype):
    fn = attention.get(name)
    for causal in (False, True):
        with FakeTensorMode():
            q = torch.randn(2, 4, 5, 8, dtype=dtype, requires_grad=True)
            k = torch.randn(2, 2, 9, 8, dtype=dtype, requires_grad=True)
            v = torch.randn(2, 2, 9, 6, dtype=dtype, requires_grad=True)
            out = fn(q, k, v, causal=causal, **options)
            out.float().mean().backward()
            with torch.no_grad():
                decoded = fn(q, k, v, causal=causal, **options)
        assert isinstance(out, FakeTensor) and out.dtype == decoded.dtype == dtype
        assert q.grad.dtype == k.grad.dtype == v.grad.dtype == dtype
