""":class:`CudaComposites`: the composite ops that branch on the device take CUDA's branch in the fake run.

A few ATen composites choose their kernels by device above the dispatcher, where a ``TorchDispatchMode`` cannot
see them; the fake run, on CPU tensors, would take the CPU branch. This ``TorchFunctionMode`` calls what CUDA's
branch calls instead, so that the fake run dispatches CUDA's ops (whose meta functions give CUDA's outputs) and
autograd records CUDA's backward:

- ``scaled_dot_product_attention`` (aten/src/ATen/native/transformers/attention.cpp): the backend of
  :func:`.sdpa_select.select_backend`, after ``convert_boolean_attn_mask`` (a boolean mask becomes an additive
  one in the query's dtype); efficient attention gets ``preprocess_mask`` (a mask whose strides are not
  multiples of 16 is padded: ``pad_bias``), flash gets head dims padded to a multiple of 8 (``pad_last_dim``);
  the logsumexp is computed when grad mode is on and an input requires grad (``should_compute_logsumexp``);
- ``dropout`` (Dropout.cpp): ``is_fused_kernel_acceptable`` (a CUDA input, ``0 < p < 1``, not empty) makes it
  ``native_dropout`` (an output and a boolean mask, which autograd keeps) instead of the CPU's float noise;
- ``softmax`` / ``log_softmax`` (SoftMax.cpp) of a half input to float: ``_softmax(input, dim, half_to_float)``
  without converting the input first.

It also hooks the graph of every ``backward`` / ``autograd.grad`` (:class:`.accumulation.EngineAdds`), so that
the trace can tell the engine's gradient accumulations apart, and stays on through the backward: a custom
``autograd.Function`` whose backward recomputes (the paper's query chunks: softmax and dropout again) takes
CUDA's branches there too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from topk_bench.predict.kernels.accumulation import EngineAdds
from topk_bench.predict.kernels.gpus import Gpu
from topk_bench.predict.kernels.sdpa_select import Backend, SdpParams, select_backend

aten = torch.ops.aten
MEM_EFF_ALIGNMENT = 16  # attention.cpp preprocess_mask
_DIFFERENTIATE = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
# torch.overrides.redispatch_function (torch 2.13); older releases have its C++ half, or neither (then a
# Function's backward runs without this mode: its composites take the CPU branch).
_REDISPATCH = getattr(torch.overrides, "redispatch_function", getattr(torch._C, "_skip_one_hop_torch_function", None))


def convert_boolean_attn_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """attention.cpp ``convert_boolean_attn_mask``: True keeps a score, False adds -inf."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=dtype, device=mask.device))


def preprocess_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """attention.cpp ``preprocess_mask``: pad an unaligned bias (``pad_bias``), expand to [B, H, Lq, Lk]."""
    aligned = all(s % MEM_EFF_ALIGNMENT == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1
    if not aligned:
        last = mask.shape[-1]
        mask = F.pad(mask, (0, MEM_EFF_ALIGNMENT - last % MEM_EFF_ALIGNMENT))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


class CudaComposites(TorchFunctionMode):
    """Routes the device-branching composites of the fake run to CUDA's branch, for ``gpu``."""

    def __init__(self, gpu: Gpu, adds: EngineAdds | None = None):
        super().__init__()
        self.gpu = gpu
        self.adds = adds
        self.backends: list[Backend] = []  # the SDPA backend of each call, in order

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.adds is not None and func in _DIFFERENTIATE:
            roots = kwargs.get("outputs", kwargs.get("tensors", args[0] if args else ()))
            self.adds.hook([roots] if isinstance(roots, torch.Tensor) else list(roots))
        if func in _DIFFERENTIATE and _REDISPATCH is not None:
            # The mode is off inside its own handler, and the engine runs the backward with the thread-local state
            # of the call: back on, one hop skipped, so that a Function's backward takes CUDA's branches too.
            with self:
                return _REDISPATCH(func, types, args, kwargs)
        if func is F.scaled_dot_product_attention:
            return self.sdpa(*args, **kwargs)
        if func in (F.dropout, torch.dropout):
            return self.dropout(*args, **kwargs)
        if func in (F.softmax, torch.softmax, F.log_softmax, torch.log_softmax):
            return self.softmax(func, *args, **kwargs)
        return func(*args, **kwargs)

    def sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        backend = select_backend(SdpParams(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa), self.gpu)
        self.backends.append(backend)
        mask = convert_boolean_attn_mask(attn_mask, query.dtype)
        lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if backend is Backend.CUDNN:
            return aten._scaled_dot_product_cudnn_attention(
                query, key, value, mask, lse, dropout_p, is_causal, False, scale=scale
            )[0]
        if backend is Backend.FLASH:
            head = query.shape[-1]
            pad = -head % 8
            q, k, v = (F.pad(t, (0, pad)) if pad else t for t in (query, key, value))
            out = aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale if scale is not None else head**-0.5
            )[0]
            return out[..., :head] if pad else out
        if backend is Backend.EFFICIENT:
            mask = preprocess_mask(mask, query, key) if mask is not None else None
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, mask, lse, dropout_p, is_causal, scale=scale
            )[0]
        return aten._scaled_dot_product_attention_math(
            query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )[0]

    @staticmethod
    def dropout(input, p=0.5, training=True, inplace=False, train=None):
        training = training if train is None else train  # torch.dropout(input, p, train)
        if training and not inplace and 0 < p < 1 and input.numel() > 0:  # is_fused_kernel_acceptable
            return aten.native_dropout(input, p, True)[0]
        return F.dropout(input, p, training, inplace)

    @staticmethod
    def softmax(func, input, dim=None, _stacklevel=3, dtype=None):
        if input.dtype == torch.float16 and dtype == torch.float32:  # SoftMax.cpp: half_to_float on CUDA
            log = func in (F.log_softmax, torch.log_softmax)
            return (aten._log_softmax if log else aten._softmax)(input, dim, True)
        return (
            func(input, dim, dtype=dtype)
            if func in (torch.softmax, torch.log_softmax)
            else func(input, dim, _stacklevel, dtype)
        )
