"""What the implementations run on, where it changes how they compute (never what they compute).

- **The target device kind** (:func:`device_kind`): the inputs' device type (``"cpu"``,
  ``"cuda"``), unless the caller runs a case for another device on stand-in tensors and says
  so with :func:`target`. The harness predicts a CUDA case's memory on fake CPU tensors; inside
  ``with target("cuda")`` the implementations shape their temporaries as on CUDA (decode's key
  tiles: :mod:`topk_bench.attention.shared.decode`), so the prediction is of what CUDA runs.
- **Native half-precision products** (:func:`native_half_matmul`): CUDA's tensor cores and CPUs
  with AVX-512 BF16 / AMX multiply bf16 (fp16: AMX-FP16) matrices in hardware; an AVX2-only
  CPU emulates them (one bf16 decode product over 131072 Llama-3-8B keys: ~240 ms, against
  ~60 ms for float32 products of the same values). Where they are not native, the half
  products of a step are computed from float32 copies of their (exactly converted) inputs,
  accumulated in float32 and rounded once to the half dtype, as a half GEMM computes them.

Decided from shapes, dtypes and the machine, never from values: the code stays shape-static
(predictable under ``FakeTensorMode``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("implementations_target_device", default=None)


@contextlib.contextmanager
def target(kind: str | None):
    """Run implementations as on a ``kind`` device (``"cpu"``, ``"cuda"``) whatever their tensors' device
    (``None``: the tensors' own device)."""
    token = _TARGET.set(None if kind is None else torch.device(kind).type)
    try:
        yield
    finally:
        _TARGET.reset(token)


def device_kind(x: torch.Tensor) -> str:
    """The device type the computation on ``x`` is for: :func:`target`'s, else ``x``'s own."""
    return _TARGET.get() or x.device.type


@functools.cache
def _cpu_multiplies_natively(dtype: torch.dtype) -> bool:
    # torch.backends.cpu.get_cpu_capability(): "AVX512" or "AVX2" (or "DEFAULT", ...) on x86; AVX-512
    # without BF16 (or AMX-FP16 for fp16) still emulates half GEMMs.
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    probe = {
        torch.bfloat16: ("_is_avx512_bf16_supported", "_is_amx_tile_supported"),
        torch.float16: ("_is_amx_fp16_supported",),
    }.get(dtype, ())
    return any(getattr(torch.cpu, name, lambda: False)() for name in probe)


def multiplies_natively(dtype: torch.dtype, device_type: str) -> bool:
    """Whether a ``device_type`` target multiplies matrices of ``dtype`` natively (True for non-half dtypes)."""
    if dtype not in (torch.float16, torch.bfloat16):
        return True
    return device_type != "cpu" or _cpu_multiplies_natively(dtype)


def native_half_matmul(x: torch.Tensor) -> bool:
    """Whether the target multiplies matrices of ``x``'s (half) dtype natively; True for other dtypes."""
    return multiplies_natively(x.dtype, device_kind(x))


def half_matmul(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` for half ``a``, ``b`` as a half GEMM computes it: float32 accumulation, one rounding.

    Natively where :func:`native_half_matmul`; otherwise from float32 copies (exact), the result
    rounded once to the half dtype (written into ``out`` when given). The two agree but for the
    GEMMs' accumulation order (a float32 ulp, so a rounding boundary in ~1e-4 of the entries).
    """
    if native_half_matmul(a):
        return torch.matmul(a, b, out=out)
    product = torch.matmul(a.float(), b.float())
    return product.to(a.dtype) if out is None else out.copy_(product)
