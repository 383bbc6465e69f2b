"""The GPUs a CUDA prediction models (``run --predict --device cuda --gpu``): one catalogue, read by the kernel
rules (what a kernel asks of ``cudaDeviceProp`` when it sizes its own allocations), by the memory budget of a
prediction (the part's memory) and by the time model (:mod:`topk_bench.predict.timing`: peaks and bandwidth).

The rules read: the compute capability (which SDPA backend runs, which CUTLASS kernel table), the SM count and
the registers and blocks per SM (``get_items_per_thread`` of TensorTopK.cu's multi-block top-k), and the cuDNN
version the CUDA 13 wheels of torch ship (SDPA prefers cuDNN on sm90 from cuDNN 9.15.1 on, sdp_utils.cpp
``check_prefer_cudnn_attention``).

Every number is NVIDIA's published figure for the part, the source named beside it. Peaks are dense (no 2:4
sparsity) and at the boost clock the datasheets quote them at; ``tensor_tf32`` is what a float32 GEMM gets only
with TF32 allowed (off in the harness: ``measure_cuda`` sets ``allow_tf32 = False``). ``memory_bytes`` is the
datasheet's capacity in decimal gigabytes (80 GB = 80e9 B = 74.5 GiB): below what CUDA reports usable (the
H100 80GB HBM3 of tests/data reports 79.18 GiB), so a case the budget passes fits the part.
"""

from __future__ import annotations

from dataclasses import dataclass

from topk_bench.types import DEFAULT_GPU, GpuModel

T = 1e12  # FLOP/s
TB = 1e12  # bytes/s
GB = 10**9
MB = 10**6


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
    memory_bytes: int  # the part's memory, as its datasheet states it (decimal GB)
    hbm_bytes_per_s: float  # memory bandwidth
    l2_bytes: int
    boost_mhz: int  # the clock the peaks are quoted at
    fp32: float  # FLOP/s on the CUDA cores (a float32 GEMM without TF32, elementwise math)
    fp64: float  # FLOP/s, float64 (tensor cores where the part has them for FP64)
    tensor_tf32: float  # FLOP/s, TF32 tensor cores, dense
    tensor_half: float  # FLOP/s, FP16/BF16 tensor cores with FP32 accumulation, dense

    @property
    def capability(self) -> int:
        """``major * 10 + minor``: 80, 90 (what attention_backward.cu passes to the CUTLASS dispatch)."""
        return self.major * 10 + self.minor


def _gpu(key: GpuModel, product: str, major: int, minor: int, sm_count: int, max_blocks: int, **spec) -> Gpu:
    return Gpu(
        key,
        f"{product} ({key.value}, sm{major}{minor}, predicted)",
        major,
        minor,
        sm_count,
        65536,  # 64K 32-bit registers per SM on every part here (CUDA C Programming Guide, table of capabilities)
        max_blocks,  # maxBlocksPerMultiProcessor: 32 on sm80/90/100, 24 on sm89 (the same table)
        91501,  # the cuDNN of the torch 2.11 CUDA 13 wheels the H100 data was taken with
        **spec,
    )


# H100 SXM5 80GB: NVIDIA H100 Tensor Core GPU datasheet (2023), "H100 SXM" column: FP64 34 TF, FP64 Tensor
# 67 TF, FP32 67 TF, TF32 989 TF and FP16/BF16 1,979 TF *with sparsity* (halved here: dense), 80 GB HBM3 at
# 3.35 TB/s; 132 SMs, 50 MB L2, 1,980 MHz boost (NVIDIA Hopper architecture whitepaper, table 3). The H100 of
# tests/data (NVIDIA H100 80GB HBM3) reports 132 SMs, L2 50 MiB and ran at 1,980 MHz (gpu_sm_clock_mhz).
H100_SXM = _gpu(
    GpuModel.H100_SXM, "NVIDIA H100 80GB HBM3", 9, 0, 132, 32,
    memory_bytes=80 * GB, hbm_bytes_per_s=3.35 * TB, l2_bytes=50 * MB, boost_mhz=1980,
    fp32=67 * T, fp64=67 * T, tensor_tf32=494.5 * T, tensor_half=989.5 * T,
)  # fmt: skip
# H100 PCIe 80GB: the same datasheet, "H100 PCIe" column: FP64 26 TF, FP64 Tensor 51 TF, FP32 51 TF, TF32 756 TF
# and FP16/BF16 1,513 TF with sparsity, 80 GB HBM2e at 2.0 TB/s; 114 SMs, 50 MB L2, 1,755 MHz boost (whitepaper).
H100_PCIE = _gpu(
    GpuModel.H100_PCIE, "NVIDIA H100 PCIe", 9, 0, 114, 32,
    memory_bytes=80 * GB, hbm_bytes_per_s=2.0 * TB, l2_bytes=50 * MB, boost_mhz=1755,
    fp32=51 * T, fp64=51 * T, tensor_tf32=378 * T, tensor_half=756.5 * T,
)  # fmt: skip
# H200 SXM 141GB: NVIDIA H200 Tensor Core GPU datasheet (2024), "H200 SXM": the H100 SXM's compute (FP32 67 TF,
# FP16/BF16 1,979 TF with sparsity), 141 GB HBM3e at 4.8 TB/s; the GH100 die: 132 SMs, 50 MB L2.
H200 = _gpu(
    GpuModel.H200, "NVIDIA H200", 9, 0, 132, 32,
    memory_bytes=141 * GB, hbm_bytes_per_s=4.8 * TB, l2_bytes=50 * MB, boost_mhz=1980,
    fp32=67 * T, fp64=67 * T, tensor_tf32=494.5 * T, tensor_half=989.5 * T,
)  # fmt: skip
# A100 SXM4: NVIDIA A100 Tensor Core GPU datasheet (2021): FP64 9.7 TF, FP64 Tensor 19.5 TF, FP32 19.5 TF, TF32
# 156 TF, FP16/BF16 312 TF (dense); 40 GB HBM2 at 1,555 GB/s, 80 GB HBM2e at 2,039 GB/s; 108 SMs, 40 MB L2,
# 1,410 MHz boost (NVIDIA A100 architecture whitepaper, table 1).
A100_40GB = _gpu(
    GpuModel.A100_40GB, "NVIDIA A100-SXM4-40GB", 8, 0, 108, 32,
    memory_bytes=40 * GB, hbm_bytes_per_s=1.555 * TB, l2_bytes=40 * MB, boost_mhz=1410,
    fp32=19.5 * T, fp64=19.5 * T, tensor_tf32=156 * T, tensor_half=312 * T,
)  # fmt: skip
A100_80GB = _gpu(
    GpuModel.A100_80GB, "NVIDIA A100-SXM4-80GB", 8, 0, 108, 32,
    memory_bytes=80 * GB, hbm_bytes_per_s=2.039 * TB, l2_bytes=40 * MB, boost_mhz=1410,
    fp32=19.5 * T, fp64=19.5 * T, tensor_tf32=156 * T, tensor_half=312 * T,
)  # fmt: skip
# L4: NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3 TF, TF32 120 TF and FP16/BF16 242 TF with sparsity,
# 24 GB GDDR6 at 300 GB/s; AD104: 58 SMs, 48 MB L2, 2,040 MHz boost (NVIDIA Ada architecture whitepaper). FP64
# runs at 1/64 of FP32 on Ada (CUDA C Programming Guide, arithmetic instructions).
L4 = _gpu(
    GpuModel.L4, "NVIDIA L4", 8, 9, 58, 24,
    memory_bytes=24 * GB, hbm_bytes_per_s=0.3 * TB, l2_bytes=48 * MB, boost_mhz=2040,
    fp32=30.3 * T, fp64=30.3 * T / 64, tensor_tf32=60 * T, tensor_half=121 * T,
)  # fmt: skip
# B200 (HGX B200, per GPU): NVIDIA HGX B200 datasheet (2025): FP64/FP64 Tensor 37 TF, FP32 75 TF, TF32 2.2 PF and
# FP16/BF16 4.5 PF with sparsity, 180 GB HBM3e at 7.7 TB/s; 148 SMs, 126 MB L2 (NVIDIA Blackwell architecture
# technical brief); boost clock about 1,965 MHz.
B200 = _gpu(
    GpuModel.B200, "NVIDIA B200", 10, 0, 148, 32,
    memory_bytes=180 * GB, hbm_bytes_per_s=7.7 * TB, l2_bytes=126 * MB, boost_mhz=1965,
    fp32=75 * T, fp64=37 * T, tensor_tf32=1100 * T, tensor_half=2250 * T,
)  # fmt: skip

GPUS: dict[GpuModel, Gpu] = {g.key: g for g in (H100_SXM, H100_PCIE, H200, A100_40GB, A100_80GB, L4, B200)}
DEFAULT = DEFAULT_GPU
# What earlier versions called them (their tests and rules read better by capability).
SM90, SM80 = H100_SXM, A100_80GB


def gpu(key: str | GpuModel) -> Gpu:
    """The GPU ``key`` names (``sm80``/``sm90`` included); ValueError naming the known ones otherwise."""
    return GPUS[GpuModel.parse(key, "GPU")]
