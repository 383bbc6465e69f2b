"""``embedding_bag`` on CUDA: aten/src/ATen/native/cuda/EmbeddingBag.cu.

``_embedding_bag_cuda`` (also ``_embedding_bag_forward_only_cuda``) first promotes indices and offsets to a
common integer type (``promoteIndicesAndOffsets``: a copy of the narrower), then allocates, in this order,
``bag_size`` (offsets' shape), ``offset2bag`` (one per index), ``output`` (bags x features) and
``max_indices`` (bags x features for ``max``, else empty), all of the indices' type. The CPU kernel sizes
``offset2bag`` and ``bag_size`` otherwise (an empty ``offset2bag`` on its fast path): the outputs here are
CUDA's. ``_embedding_bag_per_sample_weights_backward_cuda`` promotes the same way and allocates its output only.
"""

from __future__ import annotations

import torch

from topk_bench.predict.kernels.program import Call, Out, Temp, nbytes
from topk_bench.predict.kernels.registry import aten, rule

SOURCE = "aten/src/ATen/native/cuda/EmbeddingBag.cu"
MODE_MAX = 2


def _promotion(indices: torch.Tensor, offsets: torch.Tensor) -> list:
    """``promoteIndicesAndOffsets``: the narrower of the two is copied to the common type."""
    common = torch.promote_types(indices.dtype, offsets.dtype)
    return [
        Temp(name, nbytes(t.shape, common))
        for name, t in (("indices", indices), ("offsets", offsets))
        if t.dtype != common
    ]


@rule(aten._embedding_bag_forward_only.default, aten._embedding_bag.default, source=f"{SOURCE}: _embedding_bag_cuda")
def embedding_bag(call: Call):
    weight, indices, offsets = call.arg(0, "weight"), call.arg(1, "indices"), call.arg(2, "offsets")
    mode, include_last = call.arg(4, "mode", 0), call.arg(7, "include_last_offset", False)
    index = torch.promote_types(indices.dtype, offsets.dtype)
    bags = offsets.shape[0] - (1 if include_last else 0)
    features = weight.shape[1]
    return _promotion(indices, offsets) + [
        Out(2, nbytes(offsets.shape, index)),  # bag_size
        Out(1, nbytes((indices.shape[0],), index)),  # offset2bag
        Out(0),  # output
        Out(3, nbytes((bags, features) if mode == MODE_MAX else (0,), index)),  # max_indices
    ]


@rule(
    aten._embedding_bag_per_sample_weights_backward.default,
    source=f"{SOURCE}: _embedding_bag_per_sample_weights_backward_cuda",
)
def per_sample_weights_backward(call: Call):
    return _promotion(call.arg(2, "indices"), call.arg(3, "offsets"))
