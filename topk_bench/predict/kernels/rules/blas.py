"""Matrix products on CUDA: aten/src/ATen/native/cuda/Blas.cpp.

cuBLAS takes a matrix in row- or column-major order with a leading dimension; ``prepare_matrix_for_cublas``
(mm, addmm) and ``prepare_batch_matrix_for_cublas`` (bmm, baddbmm) pass an operand as it is when its strides
say one of the two, and otherwise ``clone(at::MemoryFormat::Contiguous)`` it for the call; a result that is
neither is computed into a contiguous clone and copied back. The GEMM then takes the calling thread's cuBLAS
handle, whose workspace the first call on it allocates and keeps (aten/src/ATen/cuda/CublasHandlePool.cpp,
``getCurrentCUDABlasHandle`` -> ``setWorkspaceForHandle``: ``CUBLAS_WORKSPACE_CONFIG``'s default, 32 MiB on sm90,
``4096 * 1024 * 2 + 16 * 1024 * 8`` bytes on sm80); an ``addmm`` with a 1-D bias takes the cuBLASLt path
(``isInputCompliesAddmmCudaLt``), whose own workspace (``getCUDABlasLtWorkspace``: ``CUBLASLT_WORKSPACE_SIZE``'s
default, 1 MiB, separate unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``) the first such call allocates after the
cuBLAS one (the Lt handle is the cuBLAS handle). A sparse operand takes the cuSPARSE kernels (SparseCUDABlas.cpp),
whose buffers are not modelled.
"""

from __future__ import annotations

import torch

from topk_bench.predict.kernels.gpus import Gpu
from topk_bench.predict.kernels.program import (
    Call,
    Temp,
    Unmodelled,
    Workspace,
    non_overlapping_and_dense,
    tensor_bytes,
)
from topk_bench.predict.kernels.registry import aten, rule

SOURCE = "aten/src/ATen/native/cuda/Blas.cpp"
HANDLES = "aten/src/ATen/cuda/CublasHandlePool.cpp"
CUBLASLT_WORKSPACE = 1024 * 1024  # parseCUDABlasLtWorkspaceSize: 1024 KiB


def cublas_workspace_bytes(gpu: Gpu) -> int:
    """``parseChosenWorkspaceSize``'s default: ``:4096:8`` on Hopper (and Blackwell), ``:4096:2:16:8`` otherwise."""
    return 4096 * 8 * 1024 if gpu.major in (9, 10, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8


def cublas(gpu: Gpu) -> Workspace:
    return Workspace("cuBLAS", cublas_workspace_bytes(gpu))


def cublas_lt(result: torch.Tensor, bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, beta) -> bool:
    """``isInputCompliesAddmmCudaLt`` (CUDA >= 12.1, no activation): a contiguous 1-D bias over a contiguous 2-D
    result, ``beta == 1``, a floating type cuBLASLt takes, and no operand with a single row or column."""
    return (
        beta == 1
        and result.dim() == 2
        and result.is_contiguous()
        and bias.is_contiguous()
        and bias.squeeze().dim() == 1
        and bias.shape[-1] == mat2.shape[1]
        and mat1.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)
        and min(*mat1.shape, *mat2.shape) > 1
    )


def _matrix_copied(t: torch.Tensor) -> bool:
    """``prepare_matrix_for_cublas`` clones ``t`` (2-D)."""
    if non_overlapping_and_dense(t):
        return False
    (rows, cols), (s0, s1) = t.shape, t.stride()
    return not ((s0 == 1 and s1 >= max(1, rows)) or (s1 == 1 and s0 >= max(1, cols)))


def _batch_copied(t: torch.Tensor, transpose_result: bool, m: int, n: int) -> bool:
    """``prepare_batch_matrix_for_cublas`` clones ``t`` (3-D)."""
    fast, leading = (2, 1) if transpose_result else (1, 2)
    s = t.stride()
    if (s[fast] == 1 and s[leading] >= max(1, m)) or (s[leading] == 1 and s[fast] >= max(1, n)):
        return False
    return not (t.is_contiguous() and s[1] != 0 and s[2] != 0)


SPARSE = Unmodelled("a sparse operand: cuSPARSE's buffers")


def _gemm(steps: list, gpu: Gpu, result: torch.Tensor, inner: int, *workspaces: Workspace) -> list:
    """A GEMM's steps: its copies, then the handle's workspaces; none for a sparse operand, nor when the kernel
    returns before calling cuBLAS (an empty result, an empty reduction dimension)."""
    if SPARSE in steps or result.numel() == 0 or inner == 0:
        return steps
    return steps + [cublas(gpu), *workspaces]


def _dense(*tensors: torch.Tensor) -> bool:
    return all(t.layout == torch.strided for t in tensors)


def _mm_steps(result: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> list:
    if not _dense(result, mat1, mat2):
        return [SPARSE]
    copied = _matrix_copied(result)
    steps = [Temp("result", tensor_bytes(result))] if copied else []
    if non_overlapping_and_dense(result):
        transpose_result = result.is_contiguous()
    else:
        transpose_result = copied or result.stride(1) == 1
    first, second = (mat2, mat1) if transpose_result else (mat1, mat2)
    return steps + [Temp(name, tensor_bytes(t)) for name, t in (("mat1", first), ("mat2", second)) if _matrix_copied(t)]


def _bmm_steps(result: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor) -> list:
    if not _dense(result, batch1, batch2):
        return [SPARSE]
    rs, (_, r1, r2) = result.stride(), result.shape
    transpose_result = False
    steps = []
    if rs[1] == 1 and (r2 == 1 or rs[2] >= max(1, r1)):
        pass
    elif rs[2] == 1 and (r1 == 1 or rs[1] >= max(1, r2)):
        transpose_result = True
    else:
        steps.append(Temp("result", tensor_bytes(result)))
    leading = 1 if transpose_result else 2
    m, n = (r2 if transpose_result else r1), result.shape[leading]
    k = (batch2 if transpose_result else batch1).shape[leading]
    first, second = (batch2, batch1) if transpose_result else (batch1, batch2)
    for name, t, rows, cols in (("batch1", first, m, k), ("batch2", second, k, n)):
        if _batch_copied(t, transpose_result, rows, cols):
            steps.append(Temp(name, tensor_bytes(t)))
    return steps


@rule(aten.mm.default, aten.mm.out, source=f"{SOURCE}: addmm_out_cuda_impl, prepare_matrix_for_cublas; {HANDLES}")
def mm(call: Call):
    result, mat1 = call.outputs[0], call.arg(0, "self")
    return _gemm(_mm_steps(result, mat1, call.arg(1, "mat2")), call.gpu, result, mat1.shape[1])


@rule(
    aten.addmm.default,
    aten.addmm.out,
    aten.addmm_.default,
    source=f"{SOURCE}: addmm_out_cuda_impl, prepare_matrix_for_cublas, isInputCompliesAddmmCudaLt; {HANDLES}",
)
def addmm(call: Call):
    result, bias, mat1, mat2 = call.outputs[0], call.arg(0, "self"), call.arg(1, "mat1"), call.arg(2, "mat2")
    lt = (
        result is not bias
        and _dense(result, bias, mat1, mat2)
        and cublas_lt(result, bias, mat1, mat2, call.arg(3, "beta", 1))
    )
    lt_workspace = [Workspace("cuBLASLt", CUBLASLT_WORKSPACE)] if lt else []
    return _gemm(_mm_steps(result, mat1, mat2), call.gpu, result, mat1.shape[1], *lt_workspace)


@rule(
    aten.bmm.default,
    aten.bmm.out,
    source=f"{SOURCE}: baddbmm_out_cuda_impl, prepare_batch_matrix_for_cublas; {HANDLES}",
)
def bmm(call: Call):
    result, batch1 = call.outputs[0], call.arg(0, "self")
    return _gemm(_bmm_steps(result, batch1, call.arg(1, "mat2")), call.gpu, result, batch1.shape[2])


@rule(
    aten.baddbmm.default,
    aten.baddbmm.out,
    aten.baddbmm_.default,
    source=f"{SOURCE}: baddbmm_out_cuda_impl, prepare_batch_matrix_for_cublas; {HANDLES}",
)
def baddbmm(call: Call):
    result, batch1 = call.outputs[0], call.arg(1, "batch1")
    return _gemm(_bmm_steps(result, batch1, call.arg(2, "batch2")), call.gpu, result, batch1.shape[2])
