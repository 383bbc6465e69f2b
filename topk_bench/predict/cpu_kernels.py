"""The outputs of a CPU prediction's fake run sized as the CPU kernels size them, where torch's meta kernels do not.

The fake run computes an op's outputs with its meta kernel (``torch/_meta_registrations.py``); the measured run
with its CPU kernel. Where the two disagree on an output's storage, the prediction would count bytes the
measurement never sees (or miss some), so :class:`CpuKernelOutputs`, a ``TorchDispatchMode`` between the fake
mode and the tracker, gives the tracker the CPU kernel's output instead. One rule per op, each naming the CPU
source it follows (torch 2.13):

- ``_embedding_bag``, ``_embedding_bag_forward_only`` (aten/src/ATen/native/EmbeddingBag.cpp,
  ``make_offset2bag_out``): the CPU kernel leaves ``offset2bag`` empty on its fast path (``sum`` mode, weights
  in float32, float16 *or bfloat16* with unit-stride rows, per-sample weights of unit stride, no
  ``padding_idx``); off it, ``offset2bag`` is allocated one entry longer than it ends (``indices + 1``, then
  shrunk in place). The meta kernel leaves bfloat16 off the fast path and allocates exactly ``indices`` entries
  off it: a bfloat16 ``topk_fast`` step was predicted an index per selected entry the CPU never allocates
  (int32 ``[heads, L, k]``, two live at its peak: +6 MiB per 1K tokens of a BERT-base layer at k = 64), and
  a float64 bag was measured 8 bytes more than predicted.

Decided from dtypes, strides and arguments, never from values (as the kernels decide), and the same on every
CPU kind: the fast path does not depend on the CPU's capability.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_MODE_SUM = 0
# EmbeddingBag.cpp ``is_fast_path_index_select``: the dtypes of its fast ``sum`` kernel.
_FAST_BAG_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _bag_fast_path(weight, per_sample_weights, output, padding_idx: int, mode: int) -> bool:
    """EmbeddingBag.cpp ``is_fast_path`` (``index_select_add`` / ``index_select_scale_add``), in ``sum`` mode."""
    return (
        mode == _MODE_SUM
        and weight.dtype in _FAST_BAG_DTYPES
        and weight.stride(1) == 1
        and output.stride(1) == 1
        and padding_idx < 0
        and (per_sample_weights is None or per_sample_weights.stride(0) == 1)
    )


def _embedding_bag(args, kwargs, out):
    """``offset2bag`` (output 1) as the CPU kernel allocates it: empty on the fast path, else ``indices + 1``
    entries viewed as ``indices``."""
    params = ("weight", "indices", "offsets", "scale_grad_by_freq", "mode", "sparse", "per_sample_weights")
    given = dict(zip(params + ("include_last_offset", "padding_idx"), args, strict=False)) | kwargs
    weight, indices, offsets, output = given["weight"], given["indices"], given["offsets"], out[0]
    mode, padding_idx = given.get("mode", _MODE_SUM), given.get("padding_idx", -1)
    if _bag_fast_path(weight, given.get("per_sample_weights"), output, padding_idx, mode):
        offset2bag = offsets.new_empty(0)
    else:
        entries = indices.shape[0]
        offset2bag = offsets.new_empty(entries + 1)[:entries]
    return (out[0], offset2bag, *out[2:])


_RULES: dict[object, Callable] = {
    aten._embedding_bag.default: _embedding_bag,
    aten._embedding_bag_forward_only.default: _embedding_bag,
}


class CpuKernelOutputs(TorchDispatchMode):
    """Replaces the outputs of the ops in :data:`_RULES` by the CPU kernel's. Enter it after the
    ``FakeTensorMode`` and before the tracker (it sits between them), for a CPU prediction only: a CUDA one has
    CUDA's own rules (:mod:`topk_bench.predict.kernels`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rule = _RULES.get(func)
        return out if rule is None else rule(args, kwargs, out)
