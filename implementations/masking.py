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


def chunk_mask(q_start: int, q_len: int, k_len: int, *, causal: bool, key_padding_mask=None, device=None):
    """Bool mask (True = masked) for the query chunk ``[q_start, q_start + q_len)``.

    Broadcastable to ``[B, H, q_len, k_len]``; ``None`` when nothing is masked.
    ``key_padding_mask`` is bool ``[B, k_len]`` with True marking padding.
    """
    mask = causal_block_mask(q_start, q_len, k_len, device) if causal else None
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        mask = pad if mask is None else (mask | pad)
    return mask


def safe_softmax_(scores: torch.Tensor) -> torch.Tensor:
    """Row softmax in place; a row that is all ``-inf`` becomes zeros, never NaN.

    Data-independent (no branching on values), so it runs under FakeTensorMode.
    """
    finfo = torch.finfo(scores.dtype)
    # An all -inf row has max -inf; clamping keeps exp(-inf - max) = 0 instead of NaN.
    top = scores.amax(dim=-1, keepdim=True).clamp_min_(finfo.min)
    scores.sub_(top).exp_()
    # A real row sums to >= 1 (its max gives exp(0)); an empty row sums to 0 -> 0 / tiny = 0.
    return scores.div_(scores.sum(dim=-1, keepdim=True).clamp_min_(finfo.tiny))


def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Out-of-place :func:`safe_softmax_` (not differentiable: callers derive it by hand)."""
    return safe_softmax_(scores.clone())


def batched_addmm_t_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += aᵀ @ b`` in place over the last two dims, batched over the leading ones.

    ``acc`` must be contiguous. Accumulating with ``baddbmm_`` avoids a temporary the
    size of ``acc`` (an ``Lk x d`` gradient per head) at every chunk.
    """
    batch = acc.shape[:-2]
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    acc.view(-1, *acc.shape[-2:]).baddbmm_(a3.transpose(1, 2), b3)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Chunked implementations need ``q [*, Lq, d]``, ``k [*, Lk, d]``, ``v [*, Lk, dv]`` with equal leading dims."""
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or k.shape[-2] != v.shape[-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"expected q [*, Lq, d], k [*, Lk, d], v [*, Lk, dv] with equal leading dims, "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )


def check_topk_args(q: torch.Tensor, k: torch.Tensor, topk: int, chunk_size: int, dropout: float,
                    key_padding_mask: torch.Tensor | None) -> None:
    """The options every top-k variant shares (``topk``, ``topk_sparse``, ``topk_fast``), checked once."""
    if topk < 1 or chunk_size < 1:
        raise ValueError(f"topk and chunk_size must be >= 1, got topk={topk}, chunk_size={chunk_size}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if key_padding_mask is not None and (q.dim() < 3 or tuple(key_padding_mask.shape) != (q.shape[0], k.shape[-2])):
        raise ValueError(
            f"key_padding_mask must be [B, Lk] = {(q.shape[0], k.shape[-2])} for q [B, ..., Lq, d], "
            f"got {tuple(key_padding_mask.shape)}"
        )
