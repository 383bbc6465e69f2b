"""Layer norm on CUDA: aten/src/ATen/native/cuda/layer_norm_kernel.cu.

``layer_norm_cuda`` and ``layer_norm_backward_cuda`` take ``input.expect_contiguous()`` (a copy of a strided
input) and the structured outputs. The backward's gamma/beta gradient (``LaunchGammaBetaBackwardCUDAKernel``)
allocates two partial-sum buffers of ``blocks.y x N`` (gamma's dtype) only when ``M > 64 * 1024`` and
``N / 32 < SMs / 2`` (many rows, few columns); otherwise it reduces in one kernel, without scratch.
"""

from __future__ import annotations

import math

from topk_bench.predict.kernels.program import Call, Temp, contiguous_copy
from topk_bench.predict.kernels.registry import aten, rule

SOURCE = "aten/src/ATen/native/cuda/layer_norm_kernel.cu"


def _rows_cols(x, normalized_shape) -> tuple[int, int]:
    cols = math.prod(normalized_shape)
    return (x.numel() // cols if cols else 0), cols


@rule(aten.native_layer_norm.default, source=f"{SOURCE}: layer_norm_cuda")
def layer_norm(call: Call):
    return contiguous_copy(call.arg(0, "input"), "input")


@rule(
    aten.native_layer_norm_backward.default,
    source=f"{SOURCE}: layer_norm_backward_cuda, LaunchGammaBetaBackwardCUDAKernel",
)
def layer_norm_backward(call: Call):
    grad, x, shape = call.arg(0, "grad_out"), call.arg(1, "input"), call.arg(2, "normalized_shape")
    weight, mask = call.arg(5, "weight"), call.arg(7, "output_mask", [True, True, True])
    steps = contiguous_copy(x, "input") + contiguous_copy(grad, "grad_out")
    rows, cols = _rows_cols(x, shape)
    if weight is not None and (mask[1] or mask[2]) and rows > 64 * 1024 and cols // 32 < call.gpu.sm_count // 2:
        blocks_y = min((64 * 1024 // 2) // -(-cols // 32), -(-rows // 32))
        partial = blocks_y * cols * weight.element_size()
        steps += [
            Temp(name, partial) for name, wanted in (("dgamma_blocks", mask[1]), ("dbeta_blocks", mask[2])) if wanted
        ]
    return steps
