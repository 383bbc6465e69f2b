"""Which SDPA backend CUDA runs: a port of ``select_sdp_backend`` (aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp, with the shared checks of sdp_utils_cpp.h) for dense inputs, every backend enabled, not
deterministic, not capturing a graph.

The priority order is flash, efficient, math, cuDNN; ``check_prefer_cudnn_attention`` puts cuDNN first on
sm90 and sm100 with cuDNN newer than 9.15.0 (CUDA 13 builds). A backend is taken when all its checks pass:

- flash: no mask; q, k, v of one head dim, at most 256; sm80 to sm121; not causal with Lq != Lk; half or
  bfloat16; batch and heads equal (grouped heads with ``enable_gqa``); non-empty; last dims of stride 1;
- efficient: sm50 to sm121; head dims of q and k equal, q's and v's multiples of the GEMM alignment (8 for half
  inputs, 4 for float32 on sm80+), storage offsets aligned to it; float32, half or bfloat16; batch and heads as
  above; non-empty; last dims (and the mask's) of stride 1;
- cuDNN: half or bfloat16; sm80 to sm121; dropout a multiple of 1/16; a mask of 2 or 4 dims of Lq (or 1) x Lk
  (or 1), not requiring grad; batch and heads at most 65535; head dims multiples of 8, at most 128 (256 on sm90
  with cuDNN 9.22+), key length not 1; training needs head dims <= 128 there;
- math: always.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from topk_bench.predict.kernels.gpus import Gpu

HALF = (torch.float16, torch.bfloat16)


class Backend(str, Enum):
    FLASH = "flash"
    EFFICIENT = "efficient"
    CUDNN = "cudnn"
    MATH = "math"


@dataclass(frozen=True)
class SdpParams:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout: float
    is_causal: bool
    enable_gqa: bool = False

    @property
    def requires_grad(self) -> bool:
        """``input_requires_grad``: grad mode on and any of q, k, v requiring grad."""
        return torch.is_grad_enabled() and any(t.requires_grad for t in (self.query, self.key, self.value))


def priority(gpu: Gpu) -> list[Backend]:
    if gpu.major in (9, 10) and gpu.cudnn > 91500:  # check_prefer_cudnn_attention (CUDA >= 13)
        return [Backend.CUDNN, Backend.FLASH, Backend.EFFICIENT, Backend.MATH]
    return [Backend.FLASH, Backend.EFFICIENT, Backend.MATH, Backend.CUDNN]


def _dense(p: SdpParams, *, ignore_singleton: bool) -> bool:
    """Shapes (4-D), batch and heads (grouped with ``enable_gqa``), non-empty, last dims of stride 1."""
    q, k, v = p.query, p.key, p.value
    if not (q.dim() == k.dim() == v.dim() == 4) or not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    if p.enable_gqa:
        heads = k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0
    else:
        heads = q.shape[1] == k.shape[1] == v.shape[1]
    strides = all(t.stride(-1) == 1 for t in (q, k, v)) or (ignore_singleton and q.shape[-1] == 1)
    mask = p.attn_mask is None or p.attn_mask.stride(-1) == 1
    return heads and q.shape[-2] > 0 and k.shape[-2] > 0 and strides and mask


def _in(gpu: Gpu, low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= (gpu.major, gpu.minor) <= high


def can_use_flash(p: SdpParams, gpu: Gpu) -> bool:
    q, k, v = p.query, p.key, p.value
    return (
        p.attn_mask is None
        and q.shape[-1] == k.shape[-1] == v.shape[-1] <= 256
        and _in(gpu, (8, 0), (12, 1))
        and not (p.is_causal and q.shape[-2] != k.shape[-2])
        and q.dtype in HALF
        and q.dtype == k.dtype == v.dtype
        and _dense(p, ignore_singleton=True)
    )


def gemm_alignment(dtype: torch.dtype, gpu: Gpu) -> int:
    """``minimum_gemm_alignment``: elements, 128 bits of tensor-core operands on sm80+ (at least 4)."""
    half = dtype in HALF
    align = 4 if gpu.major >= 8 else 1
    if gpu.major >= 8 or (gpu.major >= 7 and half):  # use_tensor_cores
        align = max(align, 128 // (16 if half else 32))
    return align


def can_use_efficient(p: SdpParams, gpu: Gpu) -> bool:
    q, k, v = p.query, p.key, p.value
    align = gemm_alignment(q.dtype, gpu)
    dims = q.shape[-1] == k.shape[-1] and q.shape[-1] % align == 0 and v.shape[-1] % align == 0
    offsets = gpu.major < 8 or all(t.storage_offset() % align == 0 for t in (q, k, v))
    dtypes = (torch.float16, torch.float32, torch.bfloat16) if gpu.major >= 8 else (torch.float16, torch.float32)
    return (
        _in(gpu, (5, 0), (12, 1))
        and dims
        and offsets
        and q.dtype in dtypes
        and q.dtype == k.dtype == v.dtype
        and _dense(p, ignore_singleton=False)
    )


def _cudnn_mask(p: SdpParams) -> bool:
    m, q, k = p.attn_mask, p.query, p.key
    if m is None:
        return True
    if m.requires_grad or m.shape[-2] not in (q.shape[2], 1) or m.shape[-1] not in (k.shape[2], 1):
        return False
    return m.dim() == 2 or (m.dim() == 4 and m.shape[0] in (1, q.shape[0]) and m.shape[1] in (1, q.shape[1]))


def can_use_cudnn(p: SdpParams, gpu: Gpu) -> bool:
    q, k, v = p.query, p.key, p.value
    if q.dtype not in HALF or not _in(gpu, (8, 0), (12, 1)) or p.dropout * 16 != int(p.dropout * 16):
        return False
    if not (_cudnn_mask(p) and _dense(p, ignore_singleton=True)) or q.shape[0] > 65535 or q.shape[1] > 65535:
        return False
    d_qk, d_v = q.shape[3], v.shape[3]
    limit = 256 if (gpu.major == 9 and gpu.minor == 0 or gpu.major == 10) and gpu.cudnn > 92200 else 128
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8 or k.shape[2] == 1:
        return False
    return not (limit == 256 and p.requires_grad and not (d_qk <= 128 and d_v <= 128 or d_qk == d_v == 256))


CHECKS = {
    Backend.FLASH: can_use_flash,
    Backend.EFFICIENT: can_use_efficient,
    Backend.CUDNN: can_use_cudnn,
    Backend.MATH: lambda p, gpu: True,
}


def select_backend(params: SdpParams, gpu: Gpu) -> Backend:
    """The backend ``select_sdp_backend`` returns for ``params`` on ``gpu``."""
    return next(b for b in priority(gpu) if CHECKS[b](params, gpu))
