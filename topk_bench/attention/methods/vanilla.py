"""Vanilla attention: the dense ``Lq x Lk`` score matrix, as the paper's baseline.

- Causal: bottom-right aligned (query ``i`` sees keys ``j <= Lk - Lq + i``); rows
  with no allowed key (``Lq > Lk``, or all padding) give zeros, never NaN.
- Grouped-query heads (native): the G query heads of a group are folded into the
  row axis of their K/V head (``[*, Hkv, G*Lq, d]``), so each K/V head meets all
  its queries in one product and repeated K/V never exist.
- Half precision: everything runs in the input dtype, as eager attention in half
  precision: the GEMMs accumulate in float32 and round each score once, and
  PyTorch's softmax kernels (CPU and CUDA) take a half row's max and normaliser in
  float32 and round only the weights (``tests/attention/test_half_precision.py`` checks a
  4096-key row, where a half-precision normaliser would be visibly wrong). An
  explicit float32 softmax (``dtype=torch.float32``) gives the same weights at
  twice the memory and 1.7x the time (decode step, 131072 keys).
"""

from __future__ import annotations

import torch

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.masking import (
    allowed_keys,
    by_query,
    check_activation,
    fold_groups,
    from_padding,
    kv_groups,
    rows_may_be_empty,
    unfold_groups,
)


def vanilla_attention(q, k, v, *, causal=False, activation="softmax", key_padding_mask=None):
    """``activation(q kᵀ + mask) v`` with every score materialised.

    ``key_padding_mask``: optional bool ``[B, Lk]``, True marks a padding key.
    A row with no allowed key gets zero weights (zero output), never NaN.
    """
    check_activation(activation)
    groups = kv_groups(q, k, v)
    lq, lk = q.shape[-2], k.shape[-2]
    scores = fold_groups(q, groups) @ k.transpose(-2, -1)
    grouped = by_query(scores, groups)  # [*, Hkv, G, Lq, Lk]: per-position masks broadcast over G
    allowed = allowed_keys(
        0, lq, lq, lk, causal=causal, real_keys=from_padding(key_padding_mask), device=q.device, ndim=grouped.dim()
    )
    masked = None if allowed is None else allowed.logical_not_()  # for masked_fill (in place: no copy)
    if activation == "softmax":
        if masked is not None:
            grouped = grouped.masked_fill(masked, float("-inf"))
        if rows_may_be_empty(lq, lk, causal=causal, padded=key_padding_mask is not None):
            # A row with no allowed key would be NaN: zero weights instead.
            empty = masked.all(dim=-1, keepdim=True)
            grouped = grouped.masked_fill(empty, 0.0)
            weights = torch.softmax(grouped, dim=-1).masked_fill(masked, 0.0)
        else:
            weights = torch.softmax(grouped, dim=-1)
    else:
        weights = torch.relu(grouped)
        if masked is not None:
            weights = weights.masked_fill(masked, 0.0)
    if groups > 1:
        weights = weights.flatten(-3, -2)  # back to [*, Hkv, G*Lq, Lk] (a view): V is never broadcast
    return unfold_groups(weights @ v, groups)


VANILLA = register(
    Implementation(
        name="vanilla",
        fn=vanilla_attention,
        description="dense scores, mask, activation, product (the paper's baseline)",
        options={"key_padding_mask": None},
        label="Vanilla",
        key_padding_mask=True,
        gqa="native",
    )
)
