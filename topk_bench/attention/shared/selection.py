"""Shared machinery of the selection methods, and the exact top-k selection.

Selection methods attend, for every query, exactly (softmax over the chosen keys)
to a subset of the keys; what differs is how the subset is chosen. Here:

* :func:`topk_selection`: the exact top-k of ``topk`` / ``topk_sparse`` /
  ``topk_fast`` ("Memory-efficient Transformers via Top-k Attention", Gupta et
  al. 2021): the ``topk`` largest scores among the allowed keys of each row.
* :func:`select_blocks`: the block tables of ``page_topk`` (Quest, 2024) and
  ``block_topk`` (MoBA, 2025), which attend to whole blocks of keys (pages;
  :mod:`topk_bench.attention.shared.block_attention`). Each query gets a *block table*: its
  own block (the block holding its position) plus the ``n_top`` eligible blocks
  that score highest under a method-specific block score.

Conventions (:mod:`topk_bench.attention.shared.masking`, whose helpers this module uses):
``q [B, Hq, Lq, d]``, ``k, v [B, Hkv, Lk, d]``; query ``i`` sits at position
``Lk - Lq + i`` (bottom-right causal alignment) and, when causal, sees key ``j`` iff
``j <= Lk - Lq + i``; a row with no allowed key gives zeros; a selection is a bool
mask with True = attended. Grouped-query heads are native: query head ``h`` reads kv
head ``h // (Hq // Hkv)`` and no repeated K/V is materialised.
Half precision: block and top-k scores (what decides the selection) and the
softmax are float32; outputs are in the input dtype.

Everything here is shape-static (no ``.item()``, ``nonzero`` or value-dependent
branches), so it runs under ``FakeTensorMode``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from topk_bench.attention.shared.decode import DECODE_ROWS, decode_scores
from topk_bench.attention.shared.masking import (
    allowed_keys,
    fold_groups,
    from_padding,
    group_rows,
    query_positions,
    stat_dtype,
    unfold_groups,
)
from topk_bench.attention.shared.stages import SELECTION, stage

# --------------------------------------------------------------------------- exact top-k


def topk_selection(
    q, k, *, causal=False, topk=128, chunk_size=1024, key_padding_mask=None, dropout=0.0, float_scores=True, **_ignored
) -> torch.Tensor:
    """Bool ``[B, Hq, Lq, Lk]``: the ``topk`` largest scores among each row's allowed keys.

    Allowed: bottom-right causal, and not padding (``key_padding_mask`` bool ``[B, Lk]``,
    True = padding). A row with fewer than ``topk`` allowed keys selects all of them.
    ``dropout`` drops weights after the selection, so it does not change it. Scores are
    float32 for half inputs (``float_scores=False``: in the input dtype); computed
    ``chunk_size`` query rows at a time, or, for as few query rows as a decode step has
    (:func:`~topk_bench.attention.shared.decode.use_decode_path`), as the decode step computes them
    (:func:`~topk_bench.attention.shared.decode.decode_scores`, e.g. half products from float32 tiles where
    the CPU emulates half GEMMs): the keys the step attends.
    """
    del dropout
    b, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    groups = hq // hkv
    kk = min(int(topk), lk)
    out = torch.zeros(b, hq, lq, lk, dtype=torch.bool, device=q.device)
    real_keys = from_padding(key_padding_mask)
    if lq <= min(DECODE_ROWS, int(chunk_size)):
        ok = allowed_keys(0, lq, lq, lk, causal=causal, real_keys=real_keys, device=q.device, ndim=4)
        with torch.no_grad():
            scores = decode_scores(
                q.detach(), k.detach(), groups, causal=causal, real_keys=real_keys, float_scores=float_scores
            )
        idx = scores.topk(kk, dim=-1, sorted=False).indices.view(b, hq, lq, kk)  # rows: [B*Hkv, G*Lq] = [B, Hq, Lq]
        out.scatter_(-1, idx, True)
        return out if ok is None else out & ok
    sdt = stat_dtype(q.dtype) if float_scores else q.dtype
    kt = k.to(sdt).transpose(-2, -1)
    for r0 in range(0, lq, max(1, int(chunk_size))):
        r1 = min(r0 + max(1, int(chunk_size)), lq)
        ok = allowed_keys(
            r0, r1, lq, lk, causal=causal, real_keys=real_keys, device=q.device, ndim=4
        )  # [(B, 1,) C, Lk]
        scores = unfold_groups(fold_groups(q[:, :, r0:r1].to(sdt), groups) @ kt, groups)  # [B, Hq, C, Lk]
        if ok is not None:
            scores = scores.masked_fill(~ok, float("-inf"))
        idx = scores.topk(kk, dim=-1, sorted=False).indices
        picked = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)
        # Rows with fewer than kk allowed keys pick masked ones too: the & drops them.
        out[:, :, r0:r1] = picked if ok is None else picked & ok
    return out


def topk_budget(tokens: int, options) -> dict:
    """The exact top-k's options at a budget of ``tokens`` keys per query (``topk``; the registry's ``budget``)."""
    del options
    return {"topk": max(1, int(tokens))}


# --------------------------------------------------------------------------- block tables


def n_blocks(lk: int, block_size: int) -> int:
    return -(-lk // block_size)


def current_block(r0: int, r1: int, lq: int, lk: int, block_size: int, device) -> torch.Tensor:
    """The block holding each query's position (``[C]``), clamped to block 0 for rows before the keys."""
    return torch.div(query_positions(r0, r1, lq, lk, device).clamp_min(0), block_size, rounding_mode="floor")


def select_blocks(
    q: torch.Tensor,
    hkv: int,
    lk: int,
    block_size: int,
    n_top: int,
    causal: bool,
    chunk_size: int,
    block_scores: Callable[[torch.Tensor], torch.Tensor],
    shared: bool = False,
):
    """Block table ``(blocks, ok)``, both ``[B, H, Lq, n + 1]``: top-scoring eligible blocks, then the own one.

    ``block_scores(qg)`` maps grouped query rows ``[B, Hkv, G*C, d]`` to block scores
    ``[B, Hkv, G*C, P]``. Eligible: not the own block and, when causal, not after it
    (earlier blocks hold only keys the query may see). ``n = min(n_top, P - 1)``;
    ``ok`` is False for picks that were not eligible (fewer eligible blocks than ``n``:
    topk then returns ``-inf``-scored ones). Not differentiated (as MoBA's gate).

    ``H = Hq``: one table per query head. ``shared``: ``H = Hkv``, one table per K/V head,
    shared by the G query heads of its group, which rank a block by the largest of their
    G scores (for upper bounds, the bound of the group's best query).
    """
    b, hq, lq, _ = q.shape
    g = hq // hkv
    h = hkv if shared else hq
    p = n_blocks(lk, block_size)
    n = max(0, min(int(n_top), p - 1))
    blocks = torch.empty(b, h, lq, n + 1, dtype=torch.long, device=q.device)
    ok = torch.empty(b, h, lq, n + 1, dtype=torch.bool, device=q.device)
    ids = torch.arange(p, device=q.device)
    with torch.no_grad(), stage(SELECTION):
        for r0 in range(0, lq, chunk_size):
            r1 = min(r0 + chunk_size, lq)
            c = r1 - r0
            own = current_block(r0, r1, lq, lk, block_size, q.device)  # [C]
            blocks[:, :, r0:r1, n] = own
            # The own block always holds allowed keys, except for rows before the first key.
            ok[:, :, r0:r1, n] = query_positions(r0, r1, lq, lk, q.device) >= 0 if causal else True
            if n == 0:
                continue
            scores = block_scores(group_rows(q, g, r0, r1)).view(b, hkv, g, c, p)
            if shared:
                scores = scores.amax(dim=2, keepdim=True)  # [B, Hkv, 1, C, P]
            # Causal: blocks up to the own one start at or before the query; the own block
            # is added separately. Rows before the first key (Lq > Lk) see nothing.
            shut = ids >= own.unsqueeze(1) if causal else ids == own.unsqueeze(1)  # [C, P]
            if causal:
                shut = shut | (query_positions(r0, r1, lq, lk, q.device) < 0).unsqueeze(1)
            scores = scores.masked_fill(shut, float("-inf"))
            top = scores.topk(n, dim=-1, sorted=False)
            blocks[:, :, r0:r1, :n] = top.indices.view(b, h, c, n)
            ok[:, :, r0:r1, :n] = (top.values > float("-inf")).view(b, h, c, n)
    return blocks, ok


def kept_state(state, build: Callable[[], torch.Tensor], name: str, layout: str, shape: tuple, how: str):
    """What a block method keeps with a decode cache (page summaries, block means), not differentiated:
    ``build()`` when None, else ``state`` checked to be ``shape`` (``layout`` and ``how`` name it in the error)."""
    if state is None:
        return build().detach()
    if tuple(state.shape) != shape:
        raise ValueError(f"{name} must be {layout} = {shape} ({how}), got {tuple(state.shape)}")
    return state.detach()


def per_query_head(table: torch.Tensor, hq: int) -> torch.Tensor:
    """A block table (or its ``ok``) per query head: a table shared by a group (``[B, Hkv, ...]``) repeated G times."""
    b, h = table.shape[:2]
    return (
        table
        if h == hq
        else table.unsqueeze(2).expand(b, h, hq // h, *table.shape[2:]).reshape(b, hq, *table.shape[2:])
    )


def table_selection(blocks: torch.Tensor, ok: torch.Tensor, lk: int, block_size: int, causal: bool) -> torch.Tensor:
    """Bool ``[B, H, Lq, Lk]`` of the keys a block table attends to (``H``: the table's heads)."""
    b, hq, lq, _ = blocks.shape
    p = n_blocks(lk, block_size)
    # amax, not scatter: a rejected pick (ok False) may repeat the own block's index.
    picked = torch.zeros(b, hq, lq, p, dtype=torch.uint8, device=blocks.device)
    picked.scatter_reduce_(-1, blocks, ok.to(torch.uint8), "amax")
    keys = picked.bool().repeat_interleave(block_size, dim=-1)[..., :lk]
    allowed = allowed_keys(0, lq, lq, lk, causal=causal, device=blocks.device)
    return keys.contiguous() if allowed is None else keys & allowed
