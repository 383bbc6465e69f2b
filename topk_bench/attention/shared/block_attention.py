"""Exact softmax attention of each query over the blocks of its block table
(:func:`topk_bench.attention.shared.selection.select_blocks`): the attention of ``page_topk`` and
``block_topk``, with the conventions of :mod:`topk_bench.attention.shared.selection`.

Two ways, the same result: the sampled products of :class:`_BlockSparse` (training and
prefill, forward and backward: no key or value row is copied) and, for a decode step,
:func:`_gathered_blocks` (the chosen blocks copied whole, a few MiB at a time, for dense
products; half inputs, where the target emulates half GEMMs (:mod:`topk_bench.attention.shared.hardware`):
float32 products from float32 copies of the copied blocks, rounded once as a half GEMM rounds). Shape-static: runs
under ``FakeTensorMode``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from topk_bench.attention.shared import cuda_torch
from topk_bench.attention.shared.decode import use_decode_path
from topk_bench.attention.shared.hardware import native_half_matmul
from topk_bench.attention.shared.masking import query_positions, stat_dtype
from topk_bench.attention.shared.selection import per_query_head
from topk_bench.attention.shared.stages import ATTENTION, stage


def _key_rows(blocks, ok, block_size, causal, r0, lq, lk, hkv):
    """Key rows of a chunk of the block table, as the products need them.

    ``blocks, ok [B, Hq, C, n]`` -> ``rows [R, n*block_size]`` (global rows of
    ``k.reshape(-1, d)``, int32 when they fit), ``allowed [R, n*block_size]`` (True: the
    entry has weight; a fresh mask, which :func:`_weights` negates in place) and ``empty`` (``[R, 1]``, rows without
    any key, or None when no row can
    be empty), with ``R = B*Hq*C``. Few full-size ops: this runs at every decode step.
    """
    b, hq, c, n = blocks.shape
    device = blocks.device
    index = torch.int32 if b * hkv * lk < 2**31 else torch.int64
    # First row of the query head's kv head (h // G) in the flattened [B*Hkv*Lk, d] keys.
    head = torch.arange(b, device=device).view(b, 1) * hkv + torch.arange(hq, device=device).view(1, hq) // (hq // hkv)
    base = (head * lk).view(b, hq, 1, 1).to(index)
    first = blocks.to(index) * block_size + base  # [B, Hq, C, n]
    rows = first.unsqueeze(-1) + torch.arange(block_size, dtype=index, device=device)  # [B, Hq, C, n, bs]
    # The last allowed key of each query: its own position when causal, else the last key.
    if causal:
        last = query_positions(r0, r0 + c, lq, lk, device).clamp(max=lk - 1).to(index).view(1, 1, c, 1, 1)
    else:
        last = torch.full((1, 1, c, 1, 1), lk - 1, dtype=index, device=device)
    allowed = (rows <= last + base.unsqueeze(-1)) & ok.unsqueeze(-1)
    if lk % block_size:  # a partial last block: keep its rows inside this head's keys
        rows = torch.minimum(rows, base.unsqueeze(-1) + (lk - 1))
    empty = None
    if causal and lq > lk:  # rows before the first key see nothing
        empty = (query_positions(r0, r0 + c, lq, lk, device) < 0).view(1, 1, c, 1).expand(b, hq, c, 1)
        empty = empty.reshape(b * hq * c, 1)
    m = n * block_size
    return rows.view(b * hq * c, m), allowed.view(b * hq * c, m), empty


def sampled_dots(x2, table2, rows):
    """``x2[r] · table2[rows[r, m]]`` for every entry, ``[R, M]``, without gathering the rows.

    The per-sample-weights gradient of ``embedding_bag`` is exactly this sampled product (bfloat16 on CUDA: from
    float32 copies, :func:`topk_bench.attention.shared.cuda_torch.per_sample_weights_backward`).
    """
    r, m = rows.shape
    flat = rows.reshape(-1)
    offsets = torch.arange(0, r * m, m, dtype=rows.dtype, device=rows.device)
    bag_of = torch.arange(r, dtype=rows.dtype, device=rows.device).repeat_interleave(m)
    return cuda_torch.per_sample_weights_backward(x2, table2, flat, offsets, bag_of).view(r, m)


def _weights(q2, k2, rows, allowed, empty):
    """Softmax weights ``[R, M]`` (float32 for half inputs) of each query row over its allowed key rows.

    ``allowed`` (from :func:`_key_rows`) is negated in place: it is dead afterwards.
    """
    scores = sampled_dots(q2, k2, rows).to(stat_dtype(q2.dtype)).masked_fill_(allowed.logical_not_(), float("-inf"))
    w = torch.softmax(scores, dim=-1)
    # A row without keys is NaN after the softmax: zeros instead (masked_fill replaces NaN).
    return w if empty is None else w.masked_fill_(empty, 0.0)


class _BlockSparse(torch.autograd.Function):
    """Exact softmax attention over each query's block table, ``chunk`` query rows at a time.

    Per chunk only ``B*Hq*C*M`` entries (``M`` = keys per table) exist: scores come
    from the sampled product :func:`sampled_dots`, outputs from ``embedding_bag`` (neither
    gathers the key/value rows). Backward keeps only q, k, v and the block table,
    and recomputes each chunk's weights.
    """

    @staticmethod
    def forward(ctx, q, k, v, blocks, ok, block_size, causal, chunk):
        b, hq, lq, d = q.shape
        hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
        k2, v2 = k.reshape(-1, d), v.reshape(-1, dv)
        out = q.new_empty(b, hq, lq, dv)
        with stage(ATTENTION):
            for r0 in range(0, lq, chunk):
                r1 = min(r0 + chunk, lq)
                rows, allowed, empty = _key_rows(
                    blocks[:, :, r0:r1], ok[:, :, r0:r1], block_size, causal, r0, lq, lk, hkv
                )
                w = _weights(q[:, :, r0:r1].reshape(-1, d), k2, rows, allowed, empty)
                out[:, :, r0:r1] = F.embedding_bag(rows, v2, per_sample_weights=w.to(v.dtype), mode="sum").view(
                    b, hq, r1 - r0, dv
                )
        ctx.save_for_backward(q, k, v, blocks, ok)
        ctx.options = (block_size, causal, chunk)
        return out

    @staticmethod
    def backward(ctx, dout):
        with stage(ATTENTION):
            return _BlockSparse._backward(ctx, dout)

    @staticmethod
    def _backward(ctx, dout):
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
            rows, allowed, empty = _key_rows(blocks[:, :, r0:r1], ok[:, :, r0:r1], block_size, causal, r0, lq, lk, hkv)
            q2, do2 = q[:, :, r0:r1].reshape(-1, d), dout[:, :, r0:r1].reshape(-1, dv)
            w = _weights(q2, k2, rows, allowed, empty)  # [R, M]
            dw = sampled_dots(do2, v2, rows).to(sdt)  # dout · v_j
            ds = w * (dw - (w * dw).sum(dim=-1, keepdim=True))  # softmax backward
            if need_q:
                dq[:, :, r0:r1] = F.embedding_bag(rows, k2, per_sample_weights=ds.to(k.dtype), mode="sum").view(
                    b, hq, r1 - r0, d
                )
            if not (need_k or need_v):
                continue
            # The transposed selection without gathering: entries sorted by key row, one bag of
            # query rows per key row (empty bags give zero rows). Invalid entries have w = ds = 0.
            sorted_rows, order = torch.sort(rows.reshape(-1))
            starts = torch.searchsorted(sorted_rows, torch.arange(b * hkv * lk, dtype=rows.dtype, device=rows.device))
            del sorted_rows
            query_of = torch.div(order, rows.shape[1], rounding_mode="floor")
            if need_k:
                dk += F.embedding_bag(
                    query_of, q2.to(sdt), starts, mode="sum", per_sample_weights=ds.reshape(-1).index_select(0, order)
                )
            if need_v:
                dv_ += F.embedding_bag(
                    query_of, do2.to(sdt), starts, mode="sum", per_sample_weights=w.reshape(-1).index_select(0, order)
                )
        return (
            dq,
            None if dk is None else dk.to(k.dtype).view(k.shape),
            None if dv_ is None else dv_.to(v.dtype).view(v.shape),
            None,
            None,
            None,
            None,
            None,
        )


def block_sparse_attention(
    q, k, v, blocks, ok, block_size: int, causal: bool, chunk_size: int, gather_bytes: int | None = None
) -> torch.Tensor:
    """Exact softmax attention of each query over the blocks of its table (see :func:`select_blocks`).

    Keys outside ``[0, Lk)``, after the query (when causal) or in rejected picks get no weight.
    Tables per query head or shared by a K/V head's group (``blocks [B, Hkv, ...]``). A decode
    step (no gradient, few query positions) copies the chosen blocks whole and attends to
    them with dense products (:func:`_gathered_blocks`, in parts of ``gather_bytes``, default
    :data:`GATHER_BYTES`); otherwise the sampled products of :class:`_BlockSparse`, which never copy a key row.
    """
    block_size, causal, chunk_size = int(block_size), bool(causal), max(1, int(chunk_size))
    lq, lk = q.shape[-2], k.shape[-2]
    if use_decode_path(q, k, v, chunk_size, 0.0) and block_size <= lk and not (causal and lq > lk):
        with stage(ATTENTION):
            return _gathered_blocks(q, k, v, blocks, ok, block_size, causal, gather_bytes or GATHER_BYTES)
    hq = q.shape[1]
    return _BlockSparse.apply(
        q, k, v, per_query_head(blocks, hq), per_query_head(ok, hq), block_size, causal, chunk_size
    )


# Bytes of the key and value blocks one part of :func:`_gathered_blocks` copies (it walks the
# table rows in parts of this size, at least one row): the copies are the path's working
# memory. Measured (bf16, Llama-3-8B heads, 131072 keys, a 1/16 budget in pages of 16: 4.2 MB
# per table row): 10.8 ms per step with 4 MiB parts, 11.5 ms with 32, 12.1 ms with 64.
GATHER_BYTES = 4 << 20


def _gathered_blocks(q, k, v, blocks, ok, block_size: int, causal: bool, gather_bytes: int) -> torch.Tensor:
    """Forward only: each table's blocks copied whole (one ``index_select`` of block-long windows), then dense
    attention.

    A block is ``block_size`` consecutive keys, so it is copied as one row of a view whose
    rows are windows of the flattened keys (one window starting at every key). A partial
    last block is read as the last ``block_size`` keys, its keys of the block before masked:
    no key is counted twice. A table shared by a group serves its G query heads with one copy.
    """
    b, hq, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    ht, n = blocks.shape[1], blocks.shape[-1]
    per = hq // ht  # query heads per table: 1, or G when shared
    device = q.device
    # First key of each picked window, and the row of its kv head's key 0 in the flattened keys.
    first = blocks * block_size  # [B, Ht, Lq, n]
    start = first.clamp(max=lk - block_size)
    kv_head = torch.arange(ht, device=device) * per // (hq // hkv)
    base = ((torch.arange(b, device=device).view(b, 1) * hkv + kv_head.view(1, ht)) * lk).view(b, ht, 1, 1)
    # Keys of each window with weight: in the block (not a partial last block's window before
    # it), of an accepted pick, and (causal) not after the query.
    pos = start.unsqueeze(-1) + torch.arange(block_size, device=device)  # [B, Ht, Lq, n, bs]
    allowed = (pos >= first.unsqueeze(-1)) & ok.unsqueeze(-1)
    if causal:
        allowed = allowed & (pos <= query_positions(0, lq, lq, lk, device).view(1, 1, lq, 1, 1))
    windows = (start + base).view(-1)
    keys_of = _windows(k, block_size)
    values_of = _windows(v, block_size)
    # Query rows of each table: [B, Ht, Lq, per, d] (per > 1: the group's heads at one position).
    qt = q.reshape(b, ht, per, lq, d).transpose(2, 3).reshape(b * ht * lq, per, d)
    hidden = allowed.logical_not_().view(b * ht * lq, 1, n * block_size)  # for masked_fill_ (in place: no copy)
    rows = b * ht * lq
    step = min(rows, max(1, gather_bytes // max(1, n * block_size * (d + dv) * k.element_size())))
    out = q.new_empty(rows, per, dv)
    # Buffers reused by every part (a fresh multi-MiB allocation per part costs its page faults).
    # Half inputs where the target emulates half GEMMs: float32 copies of each part's blocks (and
    # of the queries and weights) for float32 products, each rounded once as a half GEMM rounds.
    # One part's blocks at a time, keys then values in the same buffer.
    convert = not native_half_matmul(k)
    width = n * block_size * max(d, dv)
    part = k.new_empty(step * width)
    if convert:
        qt = qt.float()
        part_float = qt.new_empty(step * width)
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        m, picked = r1 - r0, windows[r0 * n : r1 * n]
        keys = torch.index_select(keys_of, 0, picked, out=part[: m * n * block_size * d].view(m * n, -1))
        keys = keys.view(m, n * block_size, d)
        if convert:  # keys on the left: with a few query rows the tall product measured 2x faster
            keys = part_float[: keys.numel()].view(keys.shape).copy_(keys)
            scores = torch.matmul(keys, qt[r0:r1].transpose(1, 2)).transpose(1, 2).to(q.dtype)
        else:  # bmm, not matmul: matmul folds a batch of one into mm, which copies bf16 keys first (8x slower)
            scores = torch.bmm(qt[r0:r1], keys.transpose(1, 2))
        del keys
        # Every row keeps its own block's first key (causal: the query sees it), so no row is all -inf.
        scores = scores.to(stat_dtype(q.dtype)).masked_fill_(hidden[r0:r1], float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(v.dtype)
        values = torch.index_select(values_of, 0, picked, out=part[: m * n * block_size * dv].view(m * n, -1))
        values = values.view(m, n * block_size, dv)
        if convert:
            values = part_float[: values.numel()].view(values.shape).copy_(values)
            out[r0:r1] = torch.matmul(weights.float(), values)
        else:
            torch.bmm(weights, values, out=out[r0:r1])
    return out.view(b, ht, lq, per, dv).transpose(2, 3).reshape(b, hq, lq, dv)


def _windows(x: torch.Tensor, size: int) -> torch.Tensor:
    """``[B*H*L - size + 1, size*d]``: row ``r`` is rows ``r .. r+size-1`` of ``x.reshape(-1, d)`` (a view)."""
    flat = x.contiguous().view(-1)
    d = x.shape[-1]
    return flat.as_strided((flat.numel() // d - size + 1, size * d), (d, 1))
