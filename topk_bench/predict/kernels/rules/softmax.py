"""Softmax and log-softmax, forward and backward: aten/src/ATen/native/cuda/SoftMax.cu.

- ``host_softmax`` (forward) takes ``input.contiguous()``: a copy of a strided input, freed on return.
- ``softmax_backward_cuda_out`` computes ``Tensor tmp = grad * output`` (an element-wise product of the
  gradient's shape and dtype) before ``host_softmax_backward`` and frees it on return: the structured output
  ``grad_input`` exists first. ``host_softmax_backward`` then takes ``grad.contiguous()`` (of ``tmp``) and
  ``output.contiguous()``.
- ``log_softmax_backward_cuda_out`` has no such product: only the two ``.contiguous()`` copies.
"""

from __future__ import annotations

import torch

from topk_bench.predict.kernels.program import Call, Temp, contiguous_copy, nbytes
from topk_bench.predict.kernels.registry import aten, rule

SOURCE = "aten/src/ATen/native/cuda/SoftMax.cu"


@rule(
    aten._softmax.default,
    aten._log_softmax.default,
    source=f"{SOURCE}: host_softmax (softmax_cuda_out, log_softmax_cuda_out)",
)
def softmax_forward(call: Call):
    return contiguous_copy(call.arg(0, "self"), "input")


@rule(aten._softmax_backward_data.default, source=f"{SOURCE}: softmax_backward_cuda_out, host_softmax_backward")
def softmax_backward(call: Call):
    grad, output = call.arg(0, "grad_output"), call.arg(1, "output")
    shape = torch.broadcast_shapes(grad.shape, output.shape)
    steps = [Temp("tmp", nbytes(shape, torch.promote_types(grad.dtype, output.dtype)))]
    if not (grad.is_contiguous() and output.is_contiguous()):
        # tmp takes the inputs' layout (TensorIterator); host_softmax_backward's grad.contiguous() copies it.
        steps.append(Temp("tmp_contiguous", nbytes(shape, torch.promote_types(grad.dtype, output.dtype))))
    return steps + contiguous_copy(output, "output")


@rule(aten._log_softmax_backward_data.default, source=f"{SOURCE}: log_softmax_backward_cuda_out, host_softmax_backward")
def log_softmax_backward(call: Call):
    return contiguous_copy(call.arg(0, "grad_output"), "grad") + contiguous_copy(call.arg(1, "output"), "output")
