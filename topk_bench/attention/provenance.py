"""Which code an implementation runs for a case where the machine decides it: what makes two rows of one case_id
the work of two programs.

An implementation declares which of these choices it makes (``Implementation.machine_choices``):

- ``native_kernels``: the compiled kernels (:mod:`topk_bench.attention.kernels.native`) on a CPU target, ``built:<build
key>``
  (its sources, flags, compiler and CPU), or ``torch:<why not>`` (disabled, no compiler, a failed build...);
- ``half_products``: a half-precision matrix product on a CPU target, ``native`` (AVX-512 BF16 / AMX) or
  ``float32_copies`` (an AVX2-only CPU emulates half GEMMs: :mod:`topk_bench.attention.shared.hardware`);
- ``decode_tiles``: the bytes of the key tiles of a decode step (:mod:`topk_bench.attention.shared.decode`), by target;
- ``triton_kernels``: the Triton kernels (:mod:`topk_bench.attention.kernels.triton`) on a CUDA target,
  ``triton:<version>``, or ``torch:<why not>`` (the torch path measured faster for the implementation,
  ``TOPK_BENCH_TRITON=0``, triton not importable: :mod:`topk_bench.attention.kernels.triton.defaults`);
- ``cuda_torch``: the torch path on a CUDA target (:mod:`topk_bench.attention.shared.cuda_torch`), ``batched`` or
``bags``
  (``TOPK_BENCH_CUDA_TORCH=bags``: the path the committed H100 measurements ran).

:func:`code_path` reads them as ``key=value`` pairs joined by ``;`` (sorted; empty when none applies). Decided from
the machine, the target and the dtype, never from a benchmark run. Importable alone (torch and the standard library).
"""

from __future__ import annotations

import torch

from topk_bench.attention import registry
from topk_bench.attention.kernels import native
from topk_bench.attention.kernels import triton as triton_kernels
from topk_bench.attention.shared import cuda_torch, decode, hardware

NATIVE_KERNELS = "native_kernels"
HALF_PRODUCTS = "half_products"
DECODE_TILES = "decode_tiles"
TRITON_KERNELS = "triton_kernels"
CUDA_TORCH = "cuda_torch"
CHOICES = (NATIVE_KERNELS, HALF_PRODUCTS, DECODE_TILES, TRITON_KERNELS, CUDA_TORCH)
FALLBACK = "torch:"  # how a native_kernels value that is not the compiled kernels starts


def _native_kernels(impl: str, device_type: str, dtype: torch.dtype) -> str:
    if device_type != "cpu":
        return ""  # CPU kernels: nothing to say of another target
    status = native.status()
    return f"built:{status.key}" if status.built else f"{FALLBACK}{status.reason}"


def _half_products(impl: str, device_type: str, dtype: torch.dtype) -> str:
    if dtype not in (torch.float16, torch.bfloat16) or device_type != "cpu":
        return ""  # full precision, or an accelerator: its own half products
    return "native" if hardware.multiplies_natively(dtype, device_type) else "float32_copies"


def _decode_tiles(impl: str, device_type: str, dtype: torch.dtype) -> str:
    tile = decode.DECODE_TILE_BYTES if device_type == "cpu" else decode.DECODE_TILE_BYTES_CUDA
    return f"{tile >> 20}MiB"


def _triton_kernels(impl: str, device_type: str, dtype: torch.dtype) -> str:
    return triton_kernels.status(impl) if device_type == "cuda" else ""  # CUDA kernels: nothing to say of the CPU


def _cuda_torch(impl: str, device_type: str, dtype: torch.dtype) -> str:
    return cuda_torch.path() if device_type == "cuda" else ""  # read by CUDA targets only


_REPORTERS = {
    NATIVE_KERNELS: _native_kernels,
    HALF_PRODUCTS: _half_products,
    DECODE_TILES: _decode_tiles,
    TRITON_KERNELS: _triton_kernels,
    CUDA_TORCH: _cuda_torch,
}


def code_path(impl: str | registry.Implementation, *, device: str, dtype: torch.dtype) -> str:
    """The machine-dependent choices ``impl`` makes for a case on ``device`` (``"cpu"``, ``"cuda:0"``...) with inputs
    of ``dtype``, as ``key=value;...``; empty when it makes none there. Builds the native kernels on first call."""
    spec = registry.spec(impl) if isinstance(impl, str) else impl
    device_type = torch.device(device).type
    values = {choice: _REPORTERS[choice](spec.name, device_type, dtype) for choice in spec.machine_choices}
    return ";".join(f"{choice}={value}" for choice, value in sorted(values.items()) if value)


def parse(text: str) -> dict[str, str]:
    """The pairs of a :func:`code_path` value."""
    return dict(part.split("=", 1) for part in text.split(";") if "=" in part)
