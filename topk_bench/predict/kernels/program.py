"""What a CUDA kernel allocates, in order: the steps a rule returns for one call of an aten op.

A rule describes the op's own device allocations as a short program over named buffers:

- :class:`Out`: output ``index`` (the ``index``-th tensor of the op's result, in ``tree_leaves`` order) is
  allocated at this point, with CUDA's size of it (``nbytes=None``: the size the fake run gave it; ``0``: CUDA
  keeps it off the device, as SDPA's philox seed and offset on the CPU). Outputs a program does not name are
  allocated first, in order (a structured kernel's outputs exist before its body runs);
- :class:`Temp`: a buffer the kernel allocates (``at::empty``, the caching allocator's ``allocate``, a
  ``.contiguous()`` copy), freed by :class:`Free` or, at the latest, when the op returns (C++ scope exit: in
  reverse order of allocation);
- :class:`Keep`: a buffer that outlives the op and is freed with output ``index`` (a tensor the kernel keeps
  with that output, which the fake run's kernel does not allocate at all);
- :class:`Workspace`: a library handle's workspace (cuBLAS, cuBLASLt), allocated by the first call on the calling
  thread's handle and kept for the process: the trace allocates it once per library and thread (the forward runs
  on the main thread, the backward on the autograd engine's device thread, each with its own handle);
- :class:`Unmodelled`: this call goes to a kernel the rule does not size (a sparse operand's cuSPARSE
  path, say): the op is listed as unmodelled.

A rule returns CUDA's behaviour, not a correction of the CPU kernel's: an output CUDA sizes differently is
given its CUDA size (:class:`Out` ``nbytes``), never an extra buffer on top of the CPU one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from topk_bench.predict.kernels.gpus import Gpu


@dataclass(frozen=True)
class Out:
    index: int
    nbytes: int | None = None


@dataclass(frozen=True)
class Temp:
    name: str
    nbytes: int


@dataclass(frozen=True)
class Free:
    name: str


@dataclass(frozen=True)
class Keep:
    name: str
    nbytes: int
    index: int


@dataclass(frozen=True)
class Workspace:
    library: str
    nbytes: int


@dataclass(frozen=True)
class Unmodelled:
    """This call's kernel allocates what the rule cannot size (why); the op is listed as unmodelled."""

    why: str


Step = Out | Temp | Free | Keep | Workspace | Unmodelled


@dataclass(frozen=True)
class Call:
    """One call of an op as a rule sees it: its arguments (fake tensors: shapes, strides, dtypes), its outputs
    (the fake run's: shapes and strides as the op's meta function gives them), and the GPU modelled."""

    func: Any
    args: tuple
    kwargs: dict
    out: Any
    gpu: Gpu

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """Argument ``name`` of the op's schema, given by position ``index`` or by keyword."""
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)

    @property
    def outputs(self) -> list[torch.Tensor]:
        return [t for t in tree_leaves(self.out) if isinstance(t, torch.Tensor)]


def nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of a dense tensor of ``shape`` and ``dtype``."""
    count = 1
    for size in shape:
        count *= int(size)
    return count * _itemsize(dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a dense copy of ``t`` (what ``.contiguous()`` or an out-of-place op on it allocates)."""
    return t.numel() * t.element_size()


def contiguous_copy(t: torch.Tensor, name: str) -> list[Step]:
    """``t.contiguous()``: a copy of ``t`` unless it already is contiguous."""
    return [] if t.is_contiguous() else [Temp(name, tensor_bytes(t))]


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """``TensorImpl::is_non_overlapping_and_dense``: the elements fill its storage span exactly, in some order."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True
