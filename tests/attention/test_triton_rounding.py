"""The kernels' rounding of float32 scores to a half dtype is torch's (to nearest, ties to even), in Triton's
interpreter too, whose own float32 to bfloat16 conversion truncates: the half-input rankings the tests hold to
the CPU path are then the ones a GPU computes."""

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from topk_bench.attention.kernels.triton.rounding import rounded  # noqa: E402


@triton.jit
def _round_kernel(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, rounded(tl.load(X + i), Y.dtype.element_ty))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounded_is_torchs_round_to_nearest(dtype):
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0), dtype=torch.float32) * 8
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-126, 0.0, -0.0], dtype=torch.float32)
    x[: len(ties)] = ties
    y = torch.empty(1024, dtype=dtype)
    _round_kernel[(1,)](x, y, N=1024)
    assert torch.equal(y.view(torch.int16), x.to(dtype).view(torch.int16))  # bit for bit, ties to even
