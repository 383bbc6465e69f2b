"""Vanilla attention: the dense ``Lq x Lk`` score matrix, as the paper's baseline."""

from __future__ import annotations

import torch

from implementations.masking import causal_block_mask, check_activation
from implementations.registry import Implementation, register


def vanilla_attention(q, k, v, *, causal=False, activation="softmax", key_padding_mask=None):
    """``activation(q kᵀ + mask) v`` with every score materialised.

    ``key_padding_mask``: optional bool ``[B, Lk]``, True marks a padding key.
    A row with no allowed key gets zero weights (zero output), never NaN.
    """
    check_activation(activation)
    scores = q @ k.transpose(-2, -1)
    masked = None
    if causal:
        masked = causal_block_mask(0, q.shape[-2], k.shape[-2], q.device)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        masked = pad if masked is None else (masked | pad)
    if activation == "softmax":
        if masked is not None:
            scores = scores.masked_fill(masked, float("-inf"))
        if key_padding_mask is not None:
            # A row whose keys are all padding would be NaN: zero weights instead.
            empty = masked.all(dim=-1, keepdim=True)
            scores = scores.masked_fill(empty, 0.0)
            weights = torch.softmax(scores, dim=-1).masked_fill(masked, 0.0)
        else:
            weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.relu(scores)
        if masked is not None:
            weights = weights.masked_fill(masked, 0.0)
    return weights @ v


VANILLA = register(
    Implementation(
        name="vanilla",
        fn=vanilla_attention,
        description="dense scores, mask, activation, product (the paper's baseline)",
        options={"key_padding_mask": None},
        label="Vanilla",
        key_padding_mask=True,
    )
)
