"""Which torch path ``topk_fast`` and ``page_topk`` take on a CUDA target: ``batched`` (the default) or ``bags``.

``bags`` is the path the committed H100 measurements ran (``tests/data/h100-*``); ``batched`` does the same arithmetic
in fewer, larger kernels, chosen for the GPU (docs/GPU.md, "The torch path on CUDA"):

- a ``topk_fast`` decode step gathers its ``k`` selected V rows per K/V head with one ``index_select`` and weighs
  them with one ``bmm`` (:func:`topk_bench.attention.shared.decode.gathered_output`), where ``bags`` runs
  ``embedding_bag``
  (one thread per bag and feature: 8,192 dependent loads each at a 1/16 budget of 131072 keys);
- ``page_topk`` keeps half-precision page summaries in the keys' dtype (half the bytes every step reads; the bound
  is still summed in float32) and copies a decode step's chosen pages in one part (:data:`GATHER_BYTES`) instead of
  parts of 4 MiB one after another;
- ``topk_fast``'s training path scores tiles of up to :data:`ROW_TILE` query rows while a tile's scores fit
  :data:`SCORE_TILE_BYTES` (never more rows than its ``chunk_size``, which bounds its memory) and runs its backward
  in groups of up to :data:`BACKWARD_ENTRIES` selected entries.

Both torch paths on CUDA avoid the aten ops whose CUDA kernel lacks the inputs' dtype (:data:`NO_CUDA_KERNEL`):
:func:`per_sample_weights_backward` computes the sampled products of ``topk_fast``'s backward and of the block-sparse
attention (``page_topk``, ``block_topk``, ``dsa``, ``nsa``) from float32 copies in bfloat16.

The CPU paths never read this. ``TOPK_BENCH_CUDA_TORCH=bags`` selects the measured path (read at every call, as
``TOPK_BENCH_TRITON``); the row's ``code_path`` says which ran (``cuda_torch=batched`` or ``cuda_torch=bags``).
"""

from __future__ import annotations

import os

import torch

from topk_bench.attention.shared.hardware import device_kind

ENV = "TOPK_BENCH_CUDA_TORCH"
BATCHED = "batched"
BAGS = "bags"
PATHS = (BATCHED, BAGS)

# Bytes of the pages one part of a decode step's gather copies on the batched path: every table row of a Llama-3-8B
# step at 131072 keys and a 1/16 budget (8 K/V heads x 4 MiB of bf16 keys and values) in one part; a larger step
# (a batch, a larger budget) still walks parts of this size.
GATHER_BYTES = 64 << 20
# Query rows per score tile of topk_fast's training path on the batched path, at most (and never more than its
# chunk_size): 1024-row tiles at chunks of 1024 halve a causal BERT-base layer's kernel launches at 16K, where
# the scores of all heads take 768 KiB a row. :data:`SCORE_TILE_BYTES` bounds a tile's scores: at 64K, 1024-row
# tiles were predicted to reserve 8.1 GiB against 4.5 GiB for 512-row ones (launches 1,470 against 2,578), more
# memory than the launches are worth on a memory-efficient path.
ROW_TILE = 2048
SCORE_TILE_BYTES = 1 << 30
# Selected entries per backward group of heads on the batched path: about 30 bytes each, so a group's temporaries
# stay under ~0.5 GiB, and a causal BERT-base layer (12 heads, k=128) at 8K runs one group, at 16K two, not 3 and 6
# (predicted peaks: docs/GPU.md).
BACKWARD_ENTRIES = 1 << 24


# Aten ops of the torch paths whose CUDA kernel lacks a dtype, and those dtypes: CUDA dispatches them on
# AT_DISPATCH_FLOATING_TYPES_AND_HALF, not ..._AND2(Half, BFloat16) (aten/src/ATen/native/cuda/EmbeddingBag.cu,
# torch 2.0 to 2.13). The rest of the paths' ops (embedding_bag's forward, index_select, sort, searchsorted, topk and
# amax of int16 ranks, matmul, softmax) have CUDA kernels for float16 and bfloat16.
NO_CUDA_KERNEL = {"aten::_embedding_bag_per_sample_weights_backward": (torch.bfloat16,)}


def per_sample_weights_backward(grad, table, indices, offsets, offset2bag) -> torch.Tensor:
    """``aten._embedding_bag_per_sample_weights_backward`` (mode sum, no padding): ``grad[offset2bag[i]] ·
    table[indices[i]]`` for every entry ``i``, in ``grad``'s dtype: the sampled product, no row gathered.

    A CUDA target in a dtype the op's CUDA kernel lacks (:data:`NO_CUDA_KERNEL`: bfloat16) runs it on float32 copies
    of ``grad`` and ``table`` and rounds the result once to the dtype: what the kernel does for float16 (float32 sums
    of the products; bfloat16 products are exact in float32), at the cost of the two copies and a float32 result
    (a causal BERT-base layer's backward at 16K, k = 128, per group of 8 heads: 48 MiB of V, 32 MiB of dout, 64 MiB
    of products).
    """
    op = torch.ops.aten._embedding_bag_per_sample_weights_backward
    if device_kind(grad) == "cuda" and grad.dtype in NO_CUDA_KERNEL[op.default.name()]:
        return op(grad.float(), table.float(), indices, offsets, offset2bag, 0, -1).to(grad.dtype)
    return op(grad, table, indices, offsets, offset2bag, 0, -1)


def row_tile(score_bytes_per_row: int, least: int) -> int:
    """Rows per score tile on the batched path: up to :data:`ROW_TILE` while the tile's scores fit
    :data:`SCORE_TILE_BYTES`, never fewer than ``least`` (the CPU's tile)."""
    return max(least, min(ROW_TILE, SCORE_TILE_BYTES // max(1, score_bytes_per_row)))


def path() -> str:
    """The path a CUDA target takes now: ``batched`` unless :data:`ENV` says ``bags``."""
    value = os.environ.get(ENV, BATCHED)
    if value not in PATHS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(PATHS)}")
    return value


def batched(x: torch.Tensor) -> bool:
    """Whether a computation on ``x`` takes the batched path: a CUDA target (:func:`device_kind`) and not ``bags``."""
    return device_kind(x) == "cuda" and path() == BATCHED
