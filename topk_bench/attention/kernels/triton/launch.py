"""What every launcher of the Triton kernels shares: whether the kernels take a call at all (the switch, the table of
measured defaults, an importable triton), the one warning of a missing triton, the dtypes they take, and the launch
itself (compiled on CUDA, interpreted on the CPU). Importable without triton."""

from __future__ import annotations

import functools
import warnings

import torch

from topk_bench.attention.kernels.triton import defaults

# The input dtypes every kernel takes (float64 runs the torch path).
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.cache
def triton_import_failure() -> str | None:
    """Why triton (or the kernels' modules) does not import here, None when it does. Tried once."""
    try:
        import triton  # noqa: F401

        from topk_bench.attention.kernels.triton import decode_kernels  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or whatever a broken triton install raises on import)
        return f"triton not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return None


def why_not_taken(impl: str, operation: str | None = None) -> str | None:
    """Why the kernels do not take ``impl``'s ``operation`` (``defaults.TRAINING`` or ``defaults.DECODE``; None: any
    of its operations) before their limits are checked (None: they may): the switch or the table of
    :mod:`.defaults`, then a missing triton. Read at every call; the import is tried once."""
    why = defaults.declined_for(impl) if operation is None else defaults.declined(impl, operation)
    return why if why is not None else triton_import_failure()


@functools.cache
def warn_torch_path(impl: str, why: str, torch_path: str, stacklevel: int) -> None:
    """Say once per process that ``impl``'s CUDA calls run ``torch_path`` because of ``why``."""
    warnings.warn(f"{impl}: {why}; CUDA runs {torch_path}", RuntimeWarning, stacklevel=stacklevel)


def why_not_taken_warned(impl: str, operation: str, torch_path: str, stacklevel: int) -> str | None:
    """:func:`why_not_taken`, and when the reason is a missing triton (the kernels were chosen: asked for, or the
    default), said once per process as a ``RuntimeWarning`` naming ``torch_path``, the path that runs instead
    (``stacklevel``: the frame it names, counted from the caller of this function)."""
    why = why_not_taken(impl, operation)
    if why is not None and why == triton_import_failure():
        warn_torch_path(impl, why, torch_path, stacklevel + 2)
    return why


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of integers."""
    return -(-a // b)


def pow2_at_least(n: int, floor: int = 16) -> int:
    """The smallest power of two ``>= n`` and ``>= floor``: a tile side (``tl.arange`` wants a power of two)."""
    return max(floor, 1 << (max(1, n) - 1).bit_length())


def strides(t: torch.Tensor) -> tuple[int, ...]:
    """Every stride of ``t``, in order: what a kernel's ``stride_*`` arguments take."""
    return tuple(t.stride())


def leading_strides(t: torch.Tensor, n: int) -> tuple[int, ...]:
    """The strides of ``t``'s first ``n`` dimensions (a kernel that reads the last one contiguously)."""
    return tuple(t.stride())[:n]


def launchable(kernel, device: torch.device):
    """``kernel`` as triton made it: compiled for CUDA, or the interpreter's (CPU tensors) when ``TRITON_INTERPRET=1``
    was set before triton was imported (its decorator decides then, for triton's own library too)."""
    from triton.runtime.interpreter import InterpretedFunction

    if device.type != "cuda" and not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(
            f"{kernel.__name__}: CPU tensors run in Triton's interpreter, which needs TRITON_INTERPRET=1 set before "
            "triton is imported"
        )
    return kernel


def launch_kernel(kernel, device: torch.device, grid: tuple[int, ...], *args, **config) -> None:
    """``kernel[grid](*args, **config)`` on ``device``'s kind of launch (:func:`launchable`); ``config``: its
    constexprs and launch options (``num_warps``)."""
    launchable(kernel, device)[grid](*args, **config)
