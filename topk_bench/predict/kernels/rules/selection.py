"""Top-k, sort and searchsorted on CUDA.

- ``topk`` (TensorTopK.cpp ``topk_out_cuda``; TensorTopK.cu ``launch_gather_topk_kernel``): the structured
  outputs, then ``self.contiguous()``; slices the multi-block heuristic takes (``should_use_multiblock``) go
  through ``mbtopk::launch``, which allocates from the caching allocator, in this order: ``kthValues``
  (a value per slice), ``ks_to_find`` and ``desired`` (two per slice), ``counts`` (a short per digit per block),
  ``digit_cum_sum`` (a uint32 per digit per slice), ``withinKCounts`` and ``kthCounts`` (one per block), then two
  cub scans by key; blocks per slice from ``get_items_per_thread`` (40 registers a thread, 256 threads a block,
  the GPU's SMs, registers and blocks per SM). ``sbtopk`` allocates nothing. A sorted result larger than the
  in-place sort (4096) sorts with two ``empty_like`` and a gather.
- ``sort`` (Sort.cpp ``sort_cuda_kernel``, Sort.cu ``launch_stable_sort_kernel``): up to 4096 along the dim, an
  in-place bitonic sort after ``fillSliceWithIndex`` (an ``arange`` of the dim); otherwise a dense copy of a
  strided input, temporaries for outputs of another layout, and by segments: one segment (or a million keys
  and more) ``segmented_sort_large_segments`` (a row of int64 indices, then cub ``SortPairs`` per segment);
  under 128 segments ``segmented_sort_pairs_by_full_sort`` (two int2 buffers, ``SortPairs`` with a keys-out
  buffer, ``SortKeys`` on the segment bits); else ``segmented_sort_pairs`` (int64 indices, the segmented sort).
- ``searchsorted`` (Bucketization.cu ``searchsorted_out_cuda``): contiguous inputs of one dtype need nothing;
  otherwise the trimmed copies of ``searchsorted_maybe_trim_input_tensors``.
"""

from __future__ import annotations

import math

import torch

from topk_bench.predict.kernels.program import (
    Call,
    Free,
    Step,
    Temp,
    contiguous_copy,
    nbytes,
    non_overlapping_and_dense,
)
from topk_bench.predict.kernels.registry import aten, rule
from topk_bench.predict.kernels.rules.cub import radix_sort_bytes, scan_by_key_bytes, segmented_radix_sort_bytes

TOPK = "aten/src/ATen/native/cuda/TensorTopK.cu"
SORT = "aten/src/ATen/native/cuda/Sort.cpp, Sort.cu"
RADIX_DIGITS, BLOCK_THREADS, REGS_PER_THREAD = 256, 256, 40
MIN_ITEMS, MAX_ITEMS = 4, 64
SMALL_SORT = 4096


def should_use_multiblock(num_slices: int, slice_size: int) -> bool:
    """TensorTopK.cu ``should_use_multiblock`` (the heuristic of pytorch#74267)."""
    if num_slices > 2**32 - 1 or slice_size > 2**32 - 1:
        return False
    return (
        (num_slices <= 20 and slice_size >= 20000)
        or (20 < num_slices <= 40 and slice_size >= 10000)
        or (40 < num_slices <= 80 and slice_size >= 8000)
        or (80 < num_slices < 200 and slice_size >= 5000)
        or (200 <= num_slices < 800 and slice_size >= 3000)
        or (800 <= num_slices <= 4000 and slice_size >= 800)
        or (num_slices > 4000 and slice_size >= 400)
    )


def items_per_thread(gpu, num_slices: int, slice_size: int) -> int:
    """TensorTopK.cu ``get_items_per_thread``: enough items that one wave of blocks covers the input."""
    blocks_per_sm = min(gpu.regs_per_sm // (REGS_PER_THREAD * BLOCK_THREADS), gpu.max_blocks_per_sm)
    items = -(-slice_size * num_slices // (gpu.sm_count * blocks_per_sm * BLOCK_THREADS))
    return max(MIN_ITEMS, min(items, MAX_ITEMS))


def mbtopk(gpu, num_slices: int, slice_size: int, dtype: torch.dtype) -> list:
    """``mbtopk::launch``'s buffers, allocated in order and freed at its end (last first)."""
    value = nbytes((), dtype)
    bitwise = 8 if value == 8 else 4  # TopKTypeConfig<T>::RadixType
    blocks_per_slice = -(-slice_size // (items_per_thread(gpu, num_slices, slice_size) * BLOCK_THREADS))
    blocks = num_slices * blocks_per_slice
    buffers = [
        ("kthValues", num_slices * value),
        ("ks_to_find", 2 * num_slices * 4),
        ("desired", 2 * num_slices * bitwise),
        ("counts", blocks * RADIX_DIGITS * 2),
        ("digit_cum_sum", num_slices * RADIX_DIGITS * 4),
        ("withinKCounts", blocks * 4),
        ("kthCounts", blocks * 4),
    ]
    steps: list[Step] = [Temp(name, size) for name, size in buffers]
    for scan in ("scan_within", "scan_kth"):  # cub::inclusive_sum_by_key of withinKCounts, then kthCounts
        steps += [Temp(scan, scan_by_key_bytes(blocks)), Free(scan)]
    return steps + [Free(name) for name, _ in reversed(buffers)]


def _slices(t: torch.Tensor, dim: int) -> tuple[int, int]:
    size = t.shape[dim] if t.dim() else 1
    return (t.numel() // size if size else 0), size


@rule(aten.topk.default, source=f"{TOPK}: launch_gather_topk_kernel, mbtopk::launch; TensorTopK.cpp: topk_out_cuda")
def topk(call: Call):
    self, k = call.arg(0, "self"), call.arg(1, "k")
    dim = call.arg(2, "dim", -1) % max(self.dim(), 1)
    is_sorted = call.arg(4, "sorted", True)
    if k == 0:
        return []
    copy = contiguous_copy(self, "input")
    steps = list(copy)
    num_slices, slice_size = _slices(self, dim)
    if self.numel() and should_use_multiblock(num_slices, slice_size):
        steps += mbtopk(call.gpu, num_slices, slice_size, self.dtype)
    steps += [Free("input")] if copy else []
    values, indices = call.outputs
    if is_sorted and values.numel() > 1 and values.shape[dim] > SMALL_SORT:
        # sortedIndices, sortedValues, sort_out_cuda(values), then indices.gather(dim, sortedIndices)
        steps += [
            Temp("sorted_indices", nbytes(indices.shape, torch.long)),
            Temp("sorted_values", nbytes(values.shape, values.dtype)),
        ]
        steps += sort_steps(call.gpu, values, dim)
        steps += [Temp("gathered", nbytes(indices.shape, torch.long)), Free("gathered")]
    return steps


def sort_steps(gpu, self: torch.Tensor, dim: int, outputs_match: bool = True) -> list:
    """``sort_cuda_kernel`` on ``self`` along ``dim`` (its outputs given, of ``self``'s layout when
    ``outputs_match``)."""
    nsort = self.shape[dim] if self.dim() else 1
    if self.numel() == 0 or self.dim() == 0:
        return []
    if nsort <= SMALL_SORT:
        return [Temp("range", nsort * 8), Free("range")]  # fillSliceWithIndex's arange; then in place
    steps = []
    if not (non_overlapping_and_dense(self) and self.stride(dim) == 1):
        steps.append(Temp("self", self.numel() * self.element_size()))
    if not outputs_match:
        steps += [Temp("values_tmp", self.numel() * self.element_size()), Temp("indices_tmp", self.numel() * 8)]
    return steps + stable_sort(self.numel(), nsort, self.element_size())


def stable_sort(numel: int, nsort: int, key_bytes: int) -> list:
    """``launch_stable_sort_kernel`` (one batch: fewer than 2^31 elements)."""
    nsegments = numel // nsort
    if nsegments == 1 or nsort >= 1_000_000:  # segmented_sort_large_segments
        steps: list[Step] = [Temp("indices", nsort * 8)]
        for _ in range(nsegments):
            steps += [Temp("cub", radix_sort_bytes(nsort, key_bytes, 8)), Free("cub")]
        return steps + [Free("indices")]
    if nsegments < 128:  # segmented_sort_pairs_by_full_sort
        segment_bits = max(1, math.ceil(math.log2(nsegments)))
        return [
            Temp("i_s", numel * 8),
            Temp("i_s2", numel * 8),
            Temp("keys_out", numel * key_bytes),
            Temp("cub", radix_sort_bytes(numel, key_bytes, 8)),
            Free("cub"),
            Free("keys_out"),
            Temp("cub_keys", radix_sort_bytes(numel, 8, 0, bits=segment_bits)),
            Free("cub_keys"),
            Free("i_s2"),
            Free("i_s"),
        ]
    # segmented_sort_pairs: reverse indices, then cub's segmented radix sort (third key and value buffers)
    return [
        Temp("reverse_indices", numel * 8),
        Temp("cub", segmented_radix_sort_bytes(numel, key_bytes, 8)),
        Free("cub"),
        Free("reverse_indices"),
    ]


@rule(aten.sort.default, aten.sort.stable, source=f"{SORT}: sort_cuda_kernel, launch_stable_sort_kernel")
def sort(call: Call):
    self = call.arg(0, "self")
    positional = call.args[1] if call.func is aten.sort.default and len(call.args) > 1 else -1
    dim = call.kwargs.get("dim", positional) % max(self.dim(), 1)  # sort.stable takes dim by keyword only
    values, indices = call.outputs
    return sort_steps(
        call.gpu, self, dim, outputs_match=values.stride() == indices.stride() == self.stride() or self.dim() <= 1
    )


@rule(aten.searchsorted.Tensor, source="aten/src/ATen/native/cuda/Bucketization.cu: searchsorted_out_cuda")
def searchsorted(call: Call):
    boundaries, values = call.arg(0, "sorted_sequence"), call.arg(1, "self")
    sorter = call.kwargs.get("sorter")
    if (
        boundaries.is_contiguous()
        and values.is_contiguous()
        and boundaries.dtype == values.dtype
        and (sorter is None or sorter.is_contiguous())
    ):
        return []
    # searchsorted_maybe_trim_input_tensors: contiguous copies, values in the boundaries' dtype
    steps: list[Step] = [Temp("values", values.numel() * boundaries.element_size())]
    steps += contiguous_copy(boundaries, "boundaries")
    return steps + (contiguous_copy(sorter, "sorter") if sorter is not None else [])
