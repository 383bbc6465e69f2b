"""The GPUs a CUDA prediction models (``run --predict --device cuda --gpu sm80|sm90``): what the kernels ask of
``cudaDeviceProp`` when they size their own allocations.

The rules read: the compute capability (which SDPA backend runs, which CUTLASS kernel table), the SM count and
the registers and blocks per SM (``get_items_per_thread`` of TensorTopK.cu's multi-block top-k), and the cuDNN
version the CUDA 13 wheels of torch ship (SDPA prefers cuDNN on sm90 from cuDNN 9.15.1 on, sdp_utils.cpp
``check_prefer_cudnn_attention``). Values are NVIDIA's published properties of the SXM parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from topk_bench.types import DEFAULT_GPU, GpuModel


@dataclass(frozen=True)
class Gpu:
    key: GpuModel  # as --gpu spells it
    name: str  # what a predicted row's device_name says
    major: int
    minor: int
    sm_count: int  # multiProcessorCount
    regs_per_sm: int  # regsPerMultiprocessor
    max_blocks_per_sm: int  # maxBlocksPerMultiProcessor
    cudnn: int  # cudnnGetVersion() of the library torch loads (major*10000 + minor*100 + patch)

    @property
    def capability(self) -> int:
        """``major * 10 + minor``: 80, 90 (what attention_backward.cu passes to the CUTLASS dispatch)."""
        return self.major * 10 + self.minor


# The H100 data (tests/data) was taken with torch 2.11.0+cu130 on an H100 80GB HBM3 (SXM5): 132 SMs.
SM90 = Gpu(GpuModel.SM90, "NVIDIA H100 80GB HBM3 (sm90, predicted)", 9, 0, 132, 65536, 32, 91501)
SM80 = Gpu(GpuModel.SM80, "NVIDIA A100-SXM4-80GB (sm80, predicted)", 8, 0, 108, 65536, 32, 91501)
GPUS: dict[GpuModel, Gpu] = {g.key: g for g in (SM80, SM90)}
DEFAULT = DEFAULT_GPU


def gpu(key: str | GpuModel) -> Gpu:
    """The GPU ``key`` names; ValueError naming the known ones otherwise."""
    return GPUS[GpuModel.parse(key, "GPU")]
