"""The conventions every implementation shares, in one place: masks, positions, grouped-query
heads, checks, the NaN-free softmax and half-precision statistics.

Conventions (see :mod:`topk_bench.attention.registry`):

- **Masks**: a boolean mask is True where the query *may* attend the key (*allowed*, as
  the boolean ``attn_mask`` of ``scaled_dot_product_attention``), in every helper here
  and every function that takes or returns a mask. The public ``key_padding_mask`` option
  (bool ``[B, Lk]``, True = padding) is converted once where it enters, by
  :func:`from_padding`. A ``masked_fill_`` needs the complement: a caller negates a fresh
  mask in place right there (``allowed.logical_not_()``), so no mask-sized temporary exists.
  (:mod:`topk_bench.attention.methods.paper` keeps the authors' own public ``mask``, True = masked, as
  their code did.)
- **Positions**: causal masks are bottom-right aligned: query ``i`` of ``Lq`` sits at
  position ``Lk - Lq + i`` (:func:`causal_offset`, :func:`query_positions`) and, when
  causal, sees key ``j`` iff ``j <= Lk - Lq + i``. A row with no allowed key gives zeros
  (:func:`safe_softmax`, :func:`rows_may_be_empty`), never NaN.
- **Grouped-query heads**: query head ``h`` reads key/value head ``h // G`` with
  ``G = Hq // Hkv`` (:func:`check_qkv`); the G query heads of a group are folded into the
  row axis of their K/V head (:func:`fold_groups`, :func:`group_rows`), so K/V are never
  repeated.
- **Half precision**: what selects keys and the softmax statistics are float32
  (:func:`stat_dtype`).

Everything here is shape-static (no ``.item()``, ``nonzero`` or value-dependent branches),
so it runs under ``FakeTensorMode``. No mask here is ``Lq x Lk`` unless asked for all rows.
"""

from __future__ import annotations

import torch

from topk_bench.attention.registry import ACTIVATIONS

HALF = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------- dtypes


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half inputs (scores that select keys, softmax statistics), else the dtype itself."""
    return torch.float32 if dtype in HALF else dtype


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in :func:`stat_dtype` (no copy for float32/float64 inputs)."""
    return x.to(stat_dtype(x.dtype))


# --------------------------------------------------------------------------- checks


def check_activation(activation: str, name: str | None = None, supported: tuple[str, ...] = ACTIVATIONS) -> None:
    """``activation`` must be one of ``supported`` (``name``: the implementation, for the message)."""
    if activation in supported:
        return
    if name is not None and tuple(supported) == ("softmax",):
        raise ValueError(f"{name} supports only activation='softmax', got {activation!r}")
    raise ValueError(f"activation must be {' or '.join(map(repr, supported))}, got {activation!r}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batched: bool = False) -> int:
    """``q [*, Hq, Lq, d]``, ``k [*, Hkv, Lk, d]``, ``v [*, Hkv, Lk, dv]``; returns ``G = Hq // Hkv``.

    Equal leading dims give ``G = 1`` (any number of them); otherwise the dims before
    the head dim must agree and ``Hq`` be a multiple of ``Hkv`` (grouped-query attention).
    ``batched``: exactly ``[B, H, L, d]`` and at least one key (the selection methods).
    """
    tails = k.shape[-2] == v.shape[-2] and q.shape[-1] == k.shape[-1] and k.shape[:-2] == v.shape[:-2]
    if batched and not (q.dim() == k.dim() == v.dim() == 4 and k.shape[1] > 0 and k.shape[2] > 0):
        tails = False
    if tails and q.shape[:-2] == k.shape[:-2]:
        return 1
    if (
        tails
        and q.dim() == k.dim() >= 3
        and q.shape[:-3] == k.shape[:-3]
        and 0 < k.shape[-3]
        and q.shape[-3] % k.shape[-3] == 0
    ):
        return q.shape[-3] // k.shape[-3]
    lead, lk = ("B, ", " and Lk >= 1") if batched else ("*, ", "")
    raise ValueError(
        f"expected q [{lead}Hq, Lq, d], k [{lead}Hkv, Lk, d], v [{lead}Hkv, Lk, dv] with equal leading dims "
        f"and Hq a multiple of Hkv{lk}, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    )


def kv_groups(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """``G`` for the dense implementations, which broadcast like ``@``: 1 unless the head dims differ,
    then :func:`check_qkv`'s."""
    if q.dim() < 3 or k.dim() < 3 or q.shape[-3] == k.shape[-3]:
        return 1
    return check_qkv(q, k, v)


def check_topk_args(
    q: torch.Tensor, k: torch.Tensor, topk: int, chunk_size: int, dropout: float, key_padding_mask: torch.Tensor | None
) -> None:
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


# --------------------------------------------------------------------------- grouped-query heads


def fold_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[*, Hq, L, d] -> [*, Hkv, G*L, d]``: the G query heads of a group as rows of their K/V head.

    Row ``r`` of K/V head ``h`` is query head ``h*G + r // L`` at position ``r % L``. A view
    of a contiguous tensor (a copy of ``x``, never of K/V, otherwise).
    """
    return x if groups == 1 else x.unflatten(-3, (-1, groups)).flatten(-3, -2)


def unfold_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Inverse of :func:`fold_groups`: ``[*, Hkv, G*L, d] -> [*, Hq, L, d]`` (a view of a contiguous ``x``)."""
    return x if groups == 1 else x.unflatten(-2, (groups, -1)).flatten(-4, -3)


def group_rows(x: torch.Tensor, groups: int, start: int, end: int) -> torch.Tensor:
    """Query positions ``[start, end)`` of every head of ``x [*, Hq, L, d]``, folded: ``[*, Hkv, G*(end-start), d]``.

    ``G == 1``: the slice itself (a view). Otherwise a copy of those rows (chunk-sized).
    """
    return fold_groups(x[..., start:end, :], groups)


def put_group_rows(dst: torch.Tensor, groups: int, start: int, end: int, src: torch.Tensor) -> None:
    """``dst[..., start:end, :] = src`` for ``src`` laid out as :func:`group_rows` returns it."""
    if groups == 1:
        dst[..., start:end, :] = src
    else:
        dst.unflatten(-3, (-1, groups))[..., start:end, :] = src.unflatten(-2, (groups, -1))


def by_query(scores: torch.Tensor, groups: int) -> torch.Tensor:
    """View folded scores ``[*, Hkv, G*C, Lk]`` as ``[*, Hkv, G, C, Lk]``, so that a per-position
    ``[C, Lk]`` mask broadcasts over the G heads (``G == 1``: ``scores`` unchanged)."""
    return scores if groups == 1 else scores.unflatten(-2, (groups, -1))


# --------------------------------------------------------------------------- positions and masks


def causal_offset(q_len: int, k_len: int) -> int:
    """Position of query 0 under bottom-right alignment: query ``i`` sits at ``Lk - Lq + i``."""
    return k_len - q_len


def query_positions(r0: int, r1: int, lq: int, lk: int, device) -> torch.Tensor:
    """Positions ``Lk - Lq + i`` of the query rows ``r0 <= i < r1`` (bottom-right alignment)."""
    return torch.arange(lk - lq + r0, lk - lq + r1, device=device)


def from_padding(key_padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The public ``key_padding_mask`` (bool ``[B, Lk]``, True = padding) as this package's
    polarity: True = a real key. Called once, where the option enters."""
    return None if key_padding_mask is None else key_padding_mask.logical_not()


def allowed_keys(
    r0: int,
    r1: int,
    lq: int,
    lk: int,
    *,
    causal: bool,
    real_keys: torch.Tensor | None = None,
    device=None,
    cols: tuple[int, int] | None = None,
    ndim: int = 2,
) -> torch.Tensor | None:
    """Bool mask, True where query row ``i`` (``r0 <= i < r1`` of ``Lq``) may attend key ``j``.

    Keys ``j`` in ``cols = (c0, c1)`` (default all ``Lk``; columns ``>= Lk`` are never
    allowed: padding a tile to a width). Causal: ``j <= Lk - Lq + i``. ``real_keys``: bool
    ``[B, Lk]``, True = a real key (:func:`from_padding`). Broadcastable to ``[r1 - r0, c1 - c0]``,
    or with ``real_keys`` to ``[B, 1, ..., r1 - r0, c1 - c0]`` with ``ndim`` dims (5 for grouped
    scores, :func:`by_query`). ``None`` when every key is allowed; otherwise a fresh
    tensor, which the caller may negate in place for a ``masked_fill_``.
    """
    c0, c1 = (0, lk) if cols is None else cols
    allowed = None
    if causal:  # key j <= position p (and j < Lk when the columns run past the keys)
        last = query_positions(r0, r1, lq, lk, device).unsqueeze(1)
        if c1 > lk:
            last = last.clamp_max(lk - 1)
        allowed = torch.arange(c0, c1, device=device) <= last  # [C, W]
    elif c1 > lk:  # the same columns for every row: [1, W]
        allowed = (torch.arange(c0, c1, device=device) < lk).unsqueeze(0)
    if real_keys is not None:
        pad = real_keys[(slice(None),) + (None,) * (ndim - 2)][..., c0 : min(c1, lk)]
        if c1 > lk:
            pad = torch.cat([pad, pad.new_zeros(*pad.shape[:-1], c1 - max(c0, lk))], dim=-1)
        elif allowed is None:
            pad = pad.clone()  # fresh: the caller may negate it in place
        allowed = pad if allowed is None else (allowed & pad)
    return allowed


def rows_may_be_empty(q_len: int, k_len: int, *, causal: bool, padded: bool = False) -> bool:
    """Whether some query row can have no allowed key (then its softmax must give zeros, not NaN).

    A shape/argument test, not a data test: with ``Lq > Lk`` the first ``Lq - Lk``
    causal rows sit before every key; padding (``padded``) can hide every key of a row.
    """
    return padded or (causal and q_len > k_len)


# --------------------------------------------------------------------------- softmax and products


def safe_softmax(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Row softmax over the ``allowed`` entries (all when None; ``-inf`` scores get weight 0);
    a row with none gives zeros, never NaN. Differentiable (autograd ops; the row maximum is
    a constant). :func:`safe_softmax_` is the same, in place.
    """
    if allowed is not None:
        scores = scores.masked_fill(allowed.logical_not(), float("-inf"))
    # An all -inf row has max -inf: clamping keeps exp(-inf - max) = 0, not NaN.
    top = scores.detach().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)
    e = torch.exp(scores - top)
    # A real row sums to >= 1 (its max gives exp(0)); an empty row sums to 0 -> 0 / tiny = 0.
    return e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


def safe_softmax_(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`safe_softmax` in place (the same values; not recorded by autograd: the callers,
    ``autograd.Function`` s, derive it by hand). No temporary the size of ``scores``."""
    if allowed is not None:
        scores.masked_fill_(allowed.logical_not(), float("-inf"))
    finfo = torch.finfo(scores.dtype)
    top = scores.amax(dim=-1, keepdim=True).clamp_min_(finfo.min)
    scores.sub_(top).exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True).clamp_min_(finfo.tiny))


def batched_addmm_t_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += aᵀ @ b`` in place over the last two dims, batched over the leading ones.

    ``acc`` must be contiguous. Accumulating with ``baddbmm_`` avoids a temporary the
    size of ``acc`` (an ``Lk x d`` gradient per head) at every chunk.
    """
    batch = acc.shape[:-2]
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    acc.view(-1, *acc.shape[-2:]).baddbmm_(a3.transpose(1, 2), b3)
