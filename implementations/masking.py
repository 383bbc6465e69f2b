"""Mask helpers shared by the implementations (no L x L tensors beyond one chunk)."""

from __future__ import annotations

import torch


def causal_block_mask(q_start: int, q_len: int, k_len: int, device) -> torch.Tensor:
    """Boolean ``[q_len, k_len]`` mask, True where key ``j`` is *after* query ``q_start + i``.

    Built for one query chunk from its offset, so a chunked implementation never
    materialises the full ``Lq x Lk`` mask.
    """
    rows = torch.arange(q_start, q_start + q_len, device=device).unsqueeze(1)
    cols = torch.arange(k_len, device=device).unsqueeze(0)
    return cols > rows


def check_activation(activation: str) -> None:
    if activation not in ("softmax", "relu"):
        raise ValueError(f"activation must be 'softmax' or 'relu', got {activation!r}")
