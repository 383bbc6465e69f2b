"""Shared machinery of the selection methods, and the exact top-k selection.

Selection methods attend, for every query, exactly (softmax over the chosen keys)
to a subset of the keys; what differs is how the subset is chosen. Here:

* :func:`topk_selection`: the exact top-k of ``topk`` / ``topk_sparse`` /
  ``topk_fast`` ("Memory-efficient Transformers via Top-k Attention", Gupta et
  al. 2021): the ``topk`` largest scores among the allowed keys of each row.
* :func:`select_blocks` and :func:`block_sparse_attention`: attention over
  whole blocks of keys (pages), the common core of ``page_topk`` (Quest, 2024)
  and ``block_topk`` (MoBA, 2025). Each query gets a *block table*: its own
  block (the block holding its position) plus the ``n_top`` eligible blocks
  that score highest under a method-specific block score.

Conventions (see :mod:`implementations.registry`): ``q [B, Hq, Lq, d]``,
``k, v [B, Hkv, Lk, d]``; query ``i`` sits at position ``Lk - Lq + i`` (bottom-right
causal alignment) and, when causal, sees key ``j`` iff ``j <= Lk - Lq + i``; a
row with no allowed key gives zeros. Grouped-query heads are native: query head
``h`` reads kv head ``h // (Hq // Hkv)`` and no repeated K/V is materialised.
Half precision: block and top-k scores (what decides the selection) and the
softmax are float32; outputs are in the input dtype.

Everything here is shape-static (no ``.item()``, ``nonzero`` or value-dependent
branches), so it runs under ``FakeTensorMode``.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from implementations.decode import use_decode_path

HALF = (torch.float16, torch.bfloat16)


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of selection scores and softmax statistics: float32 for half inputs."""
    return torch.float32 if dtype in HALF else dtype


def check_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Checks ``q [B, Hq, Lq, d]``, ``k [B, Hkv, Lk, d]``, ``v [B, Hkv, Lk, dv]``; returns ``Hq // Hkv``."""
    if (q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3]
            or q.shape[-1] != k.shape[-1] or k.shape[1] == 0 or q.shape[1] % k.shape[1] or k.shape[2] == 0):
        raise ValueError(
            f"expected q [B, Hq, Lq, d], k [B, Hkv, Lk, d], v [B, Hkv, Lk, dv] with Hq a multiple of Hkv "
            f"and Lk >= 1, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    return q.shape[1] // k.shape[1]


def check_softmax(activation: str, name: str) -> None:
    if activation != "softmax":
        raise ValueError(f"{name} supports only activation='softmax', got {activation!r}")


def query_positions(r0: int, r1: int, lq: int, lk: int, device) -> torch.Tensor:
    """Positions ``Lk - Lq + i`` of the query rows ``r0 <= i < r1`` (bottom-right alignment)."""
    return torch.arange(lk - lq + r0, lk - lq + r1, device=device)


def allowed_keys(lq: int, lk: int, causal: bool, device=None) -> torch.Tensor:
    """Bool ``[Lq, Lk]``: True where the query may see the key (bottom-right causal, or all)."""
    if not causal:
        return torch.ones(lq, lk, dtype=torch.bool, device=device)
    return torch.arange(lk, device=device) <= query_positions(0, lq, lq, lk, device).unsqueeze(1)


def grouped(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """``[B, Hq, C, d]`` -> ``[B, Hkv, G*C, d]``: the rows of each kv head's query group together."""
    b, hq, c, d = x.shape
    return x.reshape(b, hkv, (hq // hkv) * c, d)


def ungrouped(x: torch.Tensor, hq: int) -> torch.Tensor:
    """Inverse of :func:`grouped`: ``[B, Hkv, G*C, n]`` -> ``[B, Hq, C, n]``."""
    b, hkv, gc, n = x.shape
    return x.reshape(b, hq, gc // (hq // hkv), n)


def safe_softmax(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Differentiable softmax over the ``valid`` entries of each row; a row with none gives zeros."""
    scores = scores.masked_fill(~valid, float("-inf"))
    # An all -inf row has max -inf: clamping keeps exp(-inf - max) = 0, not NaN.
    top = scores.detach().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)
    e = torch.exp(scores - top)
    return e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


# --------------------------------------------------------------------------- exact top-k


def topk_selection(q, k, *, causal=False, topk=128, chunk_size=1024, key_padding_mask=None, dropout=0.0,
                   float_scores=True, **_ignored) -> torch.Tensor:
    """Bool ``[B, Hq, Lq, Lk]``: the ``topk`` largest scores among each row's allowed keys.

    Allowed: bottom-right causal, and not padding (``key_padding_mask`` bool ``[B, Lk]``,
    True = padding). A row with fewer than ``topk`` allowed keys selects all of them.
    ``dropout`` drops weights after the selection, so it does not change it. Scores are
    float32 for half inputs (``float_scores=False``: in the input dtype); computed
    ``chunk_size`` query rows at a time.
    """
    del dropout
    b, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    kk = min(int(topk), lk)
    sdt = stat_dtype(q.dtype) if float_scores else q.dtype
    kt = k.to(sdt).transpose(-2, -1)
    out = torch.zeros(b, hq, lq, lk, dtype=torch.bool, device=q.device)
    pad = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    for r0 in range(0, lq, max(1, int(chunk_size))):
        r1 = min(r0 + max(1, int(chunk_size)), lq)
        ok = allowed_keys(lq, lk, causal, q.device)[r0:r1]                      # [C, Lk]
        if pad is not None:
            ok = ok & ~pad                                                      # [B, 1, C, Lk]
        scores = ungrouped(grouped(q[:, :, r0:r1].to(sdt), hkv) @ kt, hq)       # [B, Hq, C, Lk]
        scores = scores.masked_fill(~ok, float("-inf"))
        idx = scores.topk(kk, dim=-1, sorted=False).indices
        # Rows with fewer than kk allowed keys pick masked ones too: the & drops them.
        out[:, :, r0:r1] = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True) & ok
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


def select_blocks(q: torch.Tensor, hkv: int, lk: int, block_size: int, n_top: int, causal: bool, chunk_size: int,
                  block_scores: Callable[[torch.Tensor], torch.Tensor], shared: bool = False):
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
    with torch.no_grad():
        for r0 in range(0, lq, chunk_size):
            r1 = min(r0 + chunk_size, lq)
            c = r1 - r0
            own = current_block(r0, r1, lq, lk, block_size, q.device)                      # [C]
            blocks[:, :, r0:r1, n] = own
            # The own block always holds allowed keys, except for rows before the first key.
            ok[:, :, r0:r1, n] = query_positions(r0, r1, lq, lk, q.device) >= 0 if causal else True
            if n == 0:
                continue
            scores = block_scores(grouped(q[:, :, r0:r1], hkv)).view(b, hkv, g, c, p)
            if shared:
                scores = scores.amax(dim=2, keepdim=True)                                  # [B, Hkv, 1, C, P]
            # Causal: blocks up to the own one start at or before the query; the own block
            # is added separately. Rows before the first key (Lq > Lk) see nothing.
            shut = ids >= own.unsqueeze(1) if causal else ids == own.unsqueeze(1)             # [C, P]
            if causal:
                shut = shut | (query_positions(r0, r1, lq, lk, q.device) < 0).unsqueeze(1)
            scores = scores.masked_fill(shut, float("-inf"))
            top = scores.topk(n, dim=-1, sorted=False)
            blocks[:, :, r0:r1, :n] = top.indices.view(b, h, c, n)
            ok[:, :, r0:r1, :n] = (top.values > float("-inf")).view(b, h, c, n)
    return blocks, ok


def per_query_head(table: torch.Tensor, hq: int) -> torch.Tensor:
    """A block table (or its ``ok``) per query head: a table shared by a group (``[B, Hkv, ...]``) repeated G times."""
    b, h = table.shape[:2]
    return table if h == hq else table.unsqueeze(2).expand(b, h, hq // h, *table.shape[2:]).reshape(b, hq, *table.shape[2:])


def table_selection(blocks: torch.Tensor, ok: torch.Tensor, lk: int, block_size: int, causal: bool) -> torch.Tensor:
    """Bool ``[B, H, Lq, Lk]`` of the keys a block table attends to (``H``: the table's heads)."""
    b, hq, lq, _ = blocks.shape
    p = n_blocks(lk, block_size)
    # amax, not scatter: a rejected pick (ok False) may repeat the own block's index.
    picked = torch.zeros(b, hq, lq, p, dtype=torch.uint8, device=blocks.device)
    picked.scatter_reduce_(-1, blocks, ok.to(torch.uint8), "amax")
    keys = picked.bool().repeat_interleave(block_size, dim=-1)[..., :lk]
    return keys & allowed_keys(lq, lk, causal, blocks.device)


# --------------------------------------------------------------------------- block-sparse attention


def _key_rows(blocks, ok, block_size, causal, r0, lq, lk, hkv):
    """Key rows of a chunk of the block table, as the products need them.

    ``blocks, ok [B, Hq, C, n]`` -> ``rows [R, n*block_size]`` (global rows of
    ``k.reshape(-1, d)``, int32 when they fit), ``masked [R, n*block_size]`` (True: no
    weight) and ``empty`` (``[R, 1]``, rows without any key, or None when no row can
    be empty), with ``R = B*Hq*C``. Few full-size ops: this runs at every decode step.
    """
    b, hq, c, n = blocks.shape
    device = blocks.device
    index = torch.int32 if b * hkv * lk < 2**31 else torch.int64
    # First row of the query head's kv head (h // G) in the flattened [B*Hkv*Lk, d] keys.
    head = torch.arange(b, device=device).view(b, 1) * hkv + torch.arange(hq, device=device).view(1, hq) // (hq // hkv)
    base = (head * lk).view(b, hq, 1, 1).to(index)
    first = blocks.to(index) * block_size + base                                     # [B, Hq, C, n]
    rows = first.unsqueeze(-1) + torch.arange(block_size, dtype=index, device=device)  # [B, Hq, C, n, bs]
    # The last allowed key of each query: its own position when causal, else the last key.
    if causal:
        last = query_positions(r0, r0 + c, lq, lk, device).clamp(max=lk - 1).to(index).view(1, 1, c, 1, 1)
    else:
        last = torch.full((1, 1, c, 1, 1), lk - 1, dtype=index, device=device)
    masked = (rows > last + base.unsqueeze(-1)) | ~ok.unsqueeze(-1)
    if lk % block_size:  # a partial last block: keep its rows inside this head's keys
        rows = torch.minimum(rows, base.unsqueeze(-1) + (lk - 1))
    empty = None
    if causal and lq > lk:  # rows before the first key see nothing
        empty = (query_positions(r0, r0 + c, lq, lk, device) < 0).view(1, 1, c, 1).expand(b, hq, c, 1)
        empty = empty.reshape(b * hq * c, 1)
    m = n * block_size
    return rows.view(b * hq * c, m), masked.view(b * hq * c, m), empty


def _dots(x2, table2, rows):
    """``x2[r] · table2[rows[r, m]]`` for every entry, ``[R, M]``, without gathering the rows.

    The per-sample-weights gradient of ``embedding_bag`` is exactly this sampled product.
    """
    r, m = rows.shape
    flat = rows.reshape(-1)
    offsets = torch.arange(0, r * m, m, dtype=rows.dtype, device=rows.device)
    bag_of = torch.arange(r, dtype=rows.dtype, device=rows.device).repeat_interleave(m)
    return torch.ops.aten._embedding_bag_per_sample_weights_backward(x2, table2, flat, offsets, bag_of, 0, -1).view(r, m)


def _weights(q2, k2, rows, masked, empty):
    """Softmax weights ``[R, M]`` (float32 for half inputs) of each query row over its unmasked key rows."""
    scores = _dots(q2, k2, rows).to(stat_dtype(q2.dtype)).masked_fill_(masked, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    # A row without keys is NaN after the softmax: zeros instead (masked_fill replaces NaN).
    return w if empty is None else w.masked_fill_(empty, 0.0)


class _BlockSparse(torch.autograd.Function):
    """Exact softmax attention over each query's block table, ``chunk`` query rows at a time.

    Per chunk only ``B*Hq*C*M`` entries (``M`` = keys per table) exist: scores come
    from the sampled product :func:`_dots`, outputs from ``embedding_bag`` (neither
    gathers the key/value rows). Backward keeps only q, k, v and the block table,
    and recomputes each chunk's weights.
    """

    @staticmethod
    def forward(ctx, q, k, v, blocks, ok, block_size, causal, chunk):
        b, hq, lq, d = q.shape
        hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
        k2, v2 = k.reshape(-1, d), v.reshape(-1, dv)
        out = q.new_empty(b, hq, lq, dv)
        for r0 in range(0, lq, chunk):
            r1 = min(r0 + chunk, lq)
            rows, masked, empty = _key_rows(blocks[:, :, r0:r1], ok[:, :, r0:r1], block_size, causal, r0, lq, lk, hkv)
            w = _weights(q[:, :, r0:r1].reshape(-1, d), k2, rows, masked, empty)
            out[:, :, r0:r1] = F.embedding_bag(rows, v2, per_sample_weights=w.to(v.dtype), mode="sum").view(
                b, hq, r1 - r0, dv)
        ctx.save_for_backward(q, k, v, blocks, ok)
        ctx.options = (block_size, causal, chunk)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, blocks, ok = ctx.saved_tensors
        block_size, causal, chunk = ctx.options
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        b, hq, lq, d = q.shape
        hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
        k2, v2 = k.reshape(-1, d), v.reshape(-1, dv)
        sdt = stat_dtype(q.dtype)
        dq = q.new_empty(q.shape) if need_q else None
        # Float32 accumulators for half inputs: every chunk adds into the key rows.
        dk = torch.zeros(b * hkv * lk, d, dtype=sdt, device=k.device) if need_k else None
        dv_ = torch.zeros(b * hkv * lk, dv, dtype=sdt, device=v.device) if need_v else None
        dout = dout.contiguous()
        for r0 in range(0, lq, chunk):
            r1 = min(r0 + chunk, lq)
            rows, masked, empty = _key_rows(blocks[:, :, r0:r1], ok[:, :, r0:r1], block_size, causal, r0, lq, lk, hkv)
            q2, do2 = q[:, :, r0:r1].reshape(-1, d), dout[:, :, r0:r1].reshape(-1, dv)
            w = _weights(q2, k2, rows, masked, empty)                                         # [R, M]
            dw = _dots(do2, v2, rows).to(sdt)                                         # dout · v_j
            ds = w * (dw - (w * dw).sum(dim=-1, keepdim=True))                        # softmax backward
            if need_q:
                dq[:, :, r0:r1] = F.embedding_bag(rows, k2, per_sample_weights=ds.to(k.dtype), mode="sum").view(
                    b, hq, r1 - r0, d)
            if not (need_k or need_v):
                continue
            # The transposed selection without gathering: entries sorted by key row, one bag of
            # query rows per key row (empty bags give zero rows). Invalid entries have w = ds = 0.
            sorted_rows, order = torch.sort(rows.reshape(-1))
            starts = torch.searchsorted(sorted_rows, torch.arange(b * hkv * lk, dtype=rows.dtype, device=rows.device))
            del sorted_rows
            query_of = torch.div(order, rows.shape[1], rounding_mode="floor")
            if need_k:
                dk += F.embedding_bag(query_of, q2.to(sdt), starts, mode="sum",
                                      per_sample_weights=ds.reshape(-1).index_select(0, order))
            if need_v:
                dv_ += F.embedding_bag(query_of, do2.to(sdt), starts, mode="sum",
                                       per_sample_weights=w.reshape(-1).index_select(0, order))
        return (dq, None if dk is None else dk.to(k.dtype).view(k.shape),
                None if dv_ is None else dv_.to(v.dtype).view(v.shape), None, None, None, None, None)


def block_sparse_attention(q, k, v, blocks, ok, block_size: int, causal: bool, chunk_size: int) -> torch.Tensor:
    """Exact softmax attention of each query over the blocks of its table (see :func:`select_blocks`).

    Keys outside ``[0, Lk)``, after the query (when causal) or in rejected picks get no weight.
    Tables per query head or shared by a K/V head's group (``blocks [B, Hkv, ...]``). A decode
    step (no gradient, few query positions) copies the chosen blocks whole and attends to
    them with dense products (:func:`_gathered_blocks`); otherwise the sampled products of
    :class:`_BlockSparse`, which never copy a key row.
    """
    block_size, causal, chunk_size = int(block_size), bool(causal), max(1, int(chunk_size))
    lq, lk = q.shape[-2], k.shape[-2]
    if use_decode_path(q, k, v, chunk_size, 0.0) and block_size <= lk and not (causal and lq > lk):
        return _gathered_blocks(q, k, v, blocks, ok, block_size, causal)
    hq = q.shape[1]
    return _BlockSparse.apply(q, k, v, per_query_head(blocks, hq), per_query_head(ok, hq), block_size, causal,
                              chunk_size)


# Bytes of the key and value blocks one part of :func:`_gathered_blocks` copies (it walks the
# table rows in parts of this size, at least one row): the copies are the path's working
# memory. Measured (bf16, Llama-3-8B heads, 131072 keys, a 1/16 budget in pages of 16: 4.2 MB
# per table row): 10.8 ms per step with 4 MiB parts, 11.5 ms with 32, 12.1 ms with 64.
GATHER_BYTES = 4 << 20


def _gathered_blocks(q, k, v, blocks, ok, block_size: int, causal: bool) -> torch.Tensor:
    """Forward only: each table's blocks copied whole (one ``index_select`` of block-long windows), then dense attention.

    A block is ``block_size`` consecutive keys, so it is copied as one row of a view whose
    rows are windows of the flattened keys (one window starting at every key). A partial
    last block is read as the last ``block_size`` keys, its keys of the block before masked:
    no key is counted twice. A table shared by a group serves its G query heads with one copy.
    """
    b, hq, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    ht, n = blocks.shape[1], blocks.shape[-1]
    per = hq // ht                              # query heads per table: 1, or G when shared
    device = q.device
    # First key of each picked window, and the row of its kv head's key 0 in the flattened keys.
    first = blocks * block_size                                                          # [B, Ht, Lq, n]
    start = first.clamp(max=lk - block_size)
    kv_head = torch.arange(ht, device=device) * per // (hq // hkv)
    base = ((torch.arange(b, device=device).view(b, 1) * hkv + kv_head.view(1, ht)) * lk).view(b, ht, 1, 1)
    # Keys of each window without weight: before the block (a partial last block's window),
    # after the query (causal), or a rejected pick.
    pos = start.unsqueeze(-1) + torch.arange(block_size, device=device)                 # [B, Ht, Lq, n, bs]
    masked = (pos < first.unsqueeze(-1)) | ~ok.unsqueeze(-1)
    if causal:
        masked = masked | (pos > query_positions(0, lq, lq, lk, device).view(1, 1, lq, 1, 1))
    windows = (start + base).view(-1)
    keys_of = _windows(k, block_size)
    values_of = _windows(v, block_size)
    # Query rows of each table: [B, Ht, Lq, per, d] (per > 1: the group's heads at one position).
    qt = q.view(b, ht, per, lq, d).transpose(2, 3).reshape(b * ht * lq, per, d)
    masked = masked.view(b * ht * lq, 1, n * block_size)
    rows = b * ht * lq
    step = max(1, GATHER_BYTES // max(1, n * block_size * (d + dv) * k.element_size()))
    out = q.new_empty(rows, per, dv)
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        keys = keys_of.index_select(0, windows[r0 * n: r1 * n]).view(r1 - r0, n * block_size, d)
        scores = torch.bmm(qt[r0:r1], keys.transpose(1, 2)).to(stat_dtype(q.dtype))
        del keys
        # Every row keeps its own block's first key (causal: the query sees it), so no row is all -inf.
        weights = torch.softmax(scores.masked_fill_(masked[r0:r1], float("-inf")), dim=-1).to(v.dtype)
        values = values_of.index_select(0, windows[r0 * n: r1 * n]).view(r1 - r0, n * block_size, dv)
        torch.bmm(weights, values, out=out[r0:r1])
    return out.view(b, ht, lq, per, dv).transpose(2, 3).reshape(b, hq, lq, dv)


def _windows(x: torch.Tensor, size: int) -> torch.Tensor:
    """``[B*H*L - size + 1, size*d]``: row ``r`` is rows ``r .. r+size-1`` of ``x.reshape(-1, d)`` (a view)."""
    flat = x.contiguous().view(-1)
    d = x.shape[-1]
    return flat.as_strided((flat.numel() // d - size + 1, size * d), (d, 1))
