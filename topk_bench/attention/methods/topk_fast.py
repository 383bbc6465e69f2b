"""Fast top-k attention: the paper's results (same as ``topk``) without its dense sparse-products.

The paper's implementation (§2.2, ``topk``) scatters the k kept entries of each
row into a dense ``C x Lk`` matrix for its four "sparse x dense" products, so it
costs as much as vanilla attention (its §5 limitation). Here:

* the only dense product is the score tile ``Q_c Kᵀ``; for causal attention a
  query tile only meets the keys before its end (half the work and memory);
* the row-wise top-k is exact and cheaper than the product it follows: on CPU a
  compiled kernel (:mod:`topk_bench.attention.kernels.native`: a vectorised threshold filter,
  then an exact select among its few candidates), written straight into the results;
  elsewhere (CUDA, or no C compiler) pruned: a key whose group maximum is not
  among the k largest group maxima cannot be in the row's top-k, so ``topk``
  runs on ~2·sqrt(k·Lk) candidates instead of Lk;
* the four products use the k selected entries only, through
  ``embedding_bag`` (gather-multiply-sum without materialising the gathered
  rows): ``out = W·V`` and ``dQ = dS·K`` directly, ``dW = dout·V[idx]`` by its
  per-sample-weights backward, and ``dV = Wᵀ·dout``, ``dK = dSᵀ·Q`` as bags of
  the key-sorted (transposed) selection, one sort shared by both (on CPU a
  compiled counting sort that carries the entries' rows and weights along);
* only Q, K, V, the top scores and int32 indices are kept for backward (as the
  paper); the backward runs per group of heads to bound its O(Lq·k) temporaries.

``key_padding_mask`` masks padding keys like future ones (a row with none left
gives zeros, through a NaN-free softmax used only then); ``dropout`` draws a
mask per chunk of ``chunk_size`` rows on the k weights, cached as ``Lq x k``
bools for backward (as ``topk``; the defaults leave the code path unchanged).

Everything is shape-static (no ``.item()``, ``nonzero`` or value-dependent
branches; the compiled kernels are ops whose fake kernels allocate nothing, as
the real ones), so it runs under ``FakeTensorMode`` for the predict backend.

- Causal: bottom-right aligned (query ``i`` sees keys ``j <= Lk - Lq + i``); a
  tile of rows meets only the keys up to its last row's position; a row with no
  allowed key (``Lq > Lk``) gives zeros (NaN-free softmax, as with padding).
- Grouped-query heads (native): a score tile holds its query positions of all G
  heads of a group as rows of their K/V head, and the selected indices are rows of
  K/V as they are (``h_kv·Lk + j``), so every bag reads K/V in place; backward
  runs per group of K/V heads, each with all its query heads.
- Half precision: keys are ranked by their product in the input dtype, each score
  rounded once as dense attention in that dtype rounds it (vanilla's arithmetic; no
  float32 copy of K); top values, softmax and its backward are float32 (of those
  scores); the bags take weights rounded to the input dtype. ``float_scores=True``
  ranks by float32 scores from float32 copies of the queries and of K (whole for
  training, one key tile at a time when decoding): the keys float32 inputs would pick,
  as ``topk`` ranks. Measured (CPU, one bf16 decode step of Llama-3-8B's heads over
  131072 keys, 1/16 budget): float32 ranking takes 1.5-1.9x the step of bf16 ranking,
  1.2-1.7x the dense reference's; on MiniLM's activations both rankings keep the same
  attention mass to 5 digits and 99.5-99.9% of the same keys (the rest tie within a
  bf16 rounding of the k-th score; ``suites/kv_selection.toml``).
- Decoding (no gradient, no dropout, at most ``min(64, chunk_size)`` query
  positions): :mod:`topk_bench.attention.shared.decode` computes all scores of the step (half
  inputs: one product in their dtype where the target multiplies half matrices
  natively, else float32 products of cache-sized key tiles rounded once into the half
  scores (:mod:`topk_bench.attention.shared.hardware`: an AVX2-only CPU emulates bf16 GEMMs); with
  ``float_scores``, float32 from one key tile converted at a time), then one pruned
  top-k and a bag of the selected V rows; a few large ops, no causal row tiles.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from topk_bench.attention.kernels import native
from topk_bench.attention.kernels import triton as triton_kernels
from topk_bench.attention.kernels.triton import decode as triton_decode
from topk_bench.attention.methods.topk import TOPK_OPTIONS
from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared import cuda_torch
from topk_bench.attention.shared.decode import decode_output, decode_scores, gathered_output, use_decode_path
from topk_bench.attention.shared.hardware import device_kind
from topk_bench.attention.shared.masking import (
    allowed_keys,
    causal_offset,
    check_activation,
    check_qkv,
    check_topk_args,
    from_padding,
    rows_may_be_empty,
    safe_softmax_,
    stat_dtype,
    upcast,
)
from topk_bench.attention.shared.selection import topk_budget, topk_selection

# Query rows per score tile (all heads at once: few, large ops, which matters
# on a shared 2-core machine where every parallel region can wait a scheduler
# slice). Small enough to waste little work on the causal diagonal; never more
# than the ``chunk_size`` option, which bounds memory.
ROW_TILE = 512
# Selected entries per backward group of heads: bounds the backward's O(nnz)
# temporaries (about 30 bytes per entry) while keeping the op count low.
BACKWARD_ENTRIES = 1 << 22
FACTOR = 1.0


def _segments(n: int, k: int) -> int:
    """Group size S minimising the pruned top-k's work ``n/S + k·S`` (1: plain top-k).

    Measured (CPU, k=128): pruning pays from n ~ 2048 (S=4), 1.8x faster at n=8192 (S=8).
    """
    s = int(math.sqrt(n / k))
    return s if s >= 3 else 1


# Integers of a float's width, for ranking scores by their bits (:func:`_ordered_bits`).
_SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """Floating ``x`` as integers of its width, in the same order (and back: the map is its own inverse).

    Sign and magnitude to two's complement: a negative float's magnitude bits are flipped.
    Scores are finite or -inf, never NaN. One buffer of ``x``'s size (the result).
    """
    itype = _SAME_WIDTH_INT[x.element_size()]
    bits = x.view(itype)
    flip = (bits >> (8 * x.element_size() - 1)).bitwise_and_(torch.iinfo(itype).max)
    return flip.bitwise_xor_(bits)


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """What scores are ranked by: half scores as their int16 bits (:func:`_ordered_bits`), others as they are.

    The CPU's ``topk`` on bfloat16 scores (32 rows of 32768, k=8192) took 5.7 ms, on their
    int16 bits 3.9 ms (its float comparisons handle NaN and widen each half value). For
    float32 the gain (5.6 to 4.0 ms, then 0.4 ms to convert) is not worth an integer copy
    of the input at the peak of a training tile (the CI gate's exact peaks saw +2%).
    """
    return _ordered_bits(scores) if scores.element_size() == 2 else scores


def _scores(ranks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ``dtype`` scores that :func:`_ranks` gave ``ranks`` for."""
    return ranks if ranks.dtype == dtype else _ordered_bits(ranks).view(dtype)


def _topk(x: torch.Tensor, k: int):
    """``x.topk(k, dim=-1, sorted=False)``, ranked by :func:`_ranks`."""
    values, indices = _ranks(x).topk(k, dim=-1, sorted=False)
    return _scores(values, x.dtype), indices


def _group_size(n: int, k: int) -> int:
    """Members per group of a training tile's pruned top-k (:func:`_row_topk`) over ``n`` keys (1: plain top-k).

    The work is about ``c_top·n/s`` (top-k of the group maxima) plus ``(c_top + c_gather)·k·s``
    (the candidates' gather and top-k); with a gather per element about half a top-k's
    (measured on CPU), ``s = 0.8·sqrt(n/k)`` balances them. At least k groups.
    """
    s = int(FACTOR * math.sqrt(n / k))
    return s if s >= 2 and n // s >= k else 1


def _row_topk(scores: torch.Tensor, k: int, s: int):
    """Exact row-wise top-k (unsorted) of ``scores [..., n]`` through groups of ``s`` columns (``s=1``: plain top-k).

    Columns are split into ``G = n // s`` strided groups ``{g, g+G, ..., g+(s-1)G}``; the last
    ``n - s·G`` columns are one more member of groups ``0, 1, ...``. If a group's maximum is not
    among the k largest maxima, k entries beat all of that group, so the top-k lies in the k best
    groups: ``k·s`` candidates (``k·(s+1)`` with the extra members, masked where a group has none).
    Returns the values and their columns (int64); a row with fewer than k finite entries may pick
    ``-inf`` ones, whose columns are kept below ``n``.
    """
    if s == 1:
        return _topk(scores, k)
    n = scores.shape[-1]
    g = n // s
    rem = n - s * g
    rows = scores.reshape(-1, n)
    r = rows.shape[0]
    grouped = rows[:, : s * g].unflatten(-1, (s, g))  # [r, s, G]: column i·G + j is member i of group j
    maxima = grouped.amax(dim=-2)
    tail = rows[:, s * g :]
    if rem:
        torch.maximum(maxima[:, :rem], tail, out=maxima[:, :rem])
    best = _topk(maxima, k)[1]  # [r, k]: the k best groups
    del maxima
    members = s + (1 if rem else 0)
    cand = scores.new_empty(r, members, k)
    torch.gather(grouped, -1, best.unsqueeze(1).expand(r, s, k), out=cand[:, :s])
    if rem:  # the extra member of groups < rem; -inf for the others (their index kept in range)
        torch.gather(tail, -1, best.clamp(max=rem - 1), out=cand[:, s])
        cand[:, s].masked_fill_(best >= rem, float("-inf"))
    values, pos = _topk(cand.view(r, members * k), k)
    del cand
    # Candidate ``pos = member·k + slot`` is column ``member·G + best[slot]``.
    if k & (k - 1) == 0:
        member = pos >> (k.bit_length() - 1)
        slot = pos.bitwise_and_(k - 1)
    else:
        member = torch.div(pos, k, rounding_mode="floor")
        slot = pos.sub_(member * k)
    where = best.gather(-1, slot)
    del best, pos, slot
    where.add_(member.mul_(g))
    del member
    if rem:
        where.clamp_(max=n - 1)
    return values.view(*scores.shape[:-1], k), where.view(*scores.shape[:-1], k)


def _activate(top: torch.Tensor, relu: bool, safe: bool = False) -> torch.Tensor:
    # Masked entries hold -inf: both activations give them weight exactly 0. Without
    # padding every row has an allowed key; with it a row may be all -inf: ``safe``
    # softmax gives it zeros (as ``topk``), not NaN.
    if relu:
        return torch.relu(top)
    return safe_softmax_(top.clone()) if safe else torch.softmax(top, dim=-1)


def _tiles(lq, lk, kk, causal, chunk_size, offset=0, row_tile=ROW_TILE):
    """Row tiles ``(r0, r1, n, s, width)``: ``n`` keys visible to the tile, ``width = max(n, kk) <= Lk``
    columns computed (the keys past ``n`` are masked), groups of ``s`` (:func:`_group_size`).

    ``offset``: position of query 0 (bottom-right causal, ``Lk - Lq``); ``row_tile``: rows a tile (<= chunk_size).
    """
    rows = max(1, min(chunk_size, row_tile))
    for r0 in range(0, lq, rows):
        r1 = min(r0 + rows, lq)
        n = min(max(offset + r1, 0), lk) if causal else lk
        width = max(n, kk)  # kk <= Lk: at least kk real keys, so that each row has kk entries
        yield r0, r1, n, _group_size(width, kk), width


def _select(q3, k3, causal, kk, chunk_size, real_keys=None, groups=1, float_scores=True):
    """Top-``kk`` scores of every query row and their global key indices (``h·Lk + j``).

    ``q3 [bh, Lq, d]`` (query heads), ``k3 [bh / groups, Lk, d]`` (K/V heads, ``h`` above);
    ``real_keys``: bool ``[bh / groups, 1, Lk]``, True = a real key (padding is masked like a future key).
    Scores (and the returned top values) are float32 for half inputs; ``float_scores=False``:
    the scores are the product in the input dtype (returned as float32).

    Per tile of rows: one product with the keys the tile sees, ``-inf`` on the causal diagonal's
    future keys, then the row top-k on the tile as it is (no copy of K, no padding columns): the
    compiled kernel (:mod:`topk_bench.attention.kernels.native`, CPU), writing straight into the results, on
    tiles of a few heads that stay in the CPU's cache (:data:`TILE_BYTES`); else the pruned
    ``torch.topk`` (:func:`_row_topk`) on tiles of all heads at once.
    """
    bh, lq, d = q3.shape
    bkv, lk = k3.shape[:2]
    device = q3.device
    offset = causal_offset(lq, lk)
    index_dtype = torch.int32 if bkv * lk < 2**31 else torch.int64
    top = q3.new_empty(bh, lq, kk, dtype=stat_dtype(q3.dtype))
    idx = torch.empty(bh, lq, kk, dtype=index_dtype, device=device)
    score_dtype = stat_dtype(q3.dtype) if float_scores else q3.dtype
    # The compiled CPU top-k when the scores are what ``top`` holds.
    compiled = score_dtype == top.dtype and native.available(score_dtype, device_kind(q3))
    # Each K/V head's first key row (the torch path adds it; the kernel adds it itself).
    base = None if compiled else (torch.arange(bkv, device=device) * lk).view(bkv, 1, 1, 1)
    keys = k3.to(score_dtype)  # a float32 copy for half inputs: scores that select keys are not rounded
    pad = None if real_keys is None else real_keys.logical_not()  # for masked_fill_
    if pad is not None and groups > 1:
        pad = pad.unsqueeze(1)  # broadcast over the G heads of a group
    itemsize = keys.element_size()
    # The batched CUDA path (:mod:`topk_bench.attention.shared.cuda_torch`): fewer, larger tiles where their scores fit
    # its bound.
    row_tile = cuda_torch.row_tile(bh * lk * itemsize, ROW_TILE) if cuda_torch.batched(q3) else ROW_TILE
    tiles = [
        (r0, r1, n, s, width, _heads_per_tile(bkv, groups * (r1 - r0) * width * itemsize, compiled))
        for r0, r1, n, s, width in _tiles(lq, lk, kk, causal, chunk_size, offset, row_tile)
    ]
    # One score buffer for all tiles: no fresh pages (and page faults) per tile.
    buffer = keys.new_empty(max((h * groups * (r1 - r0) * w for r0, r1, _, _, w, h in tiles), default=0))
    hidden = {}  # the complement of a tile's allowed keys depends only on its offsets relative to ``lo``
    for r0, r1, n, s, width, heads in tiles:
        for h0 in range(0, bkv, heads):
            h1 = min(h0 + heads, bkv)
            scores = buffer[: (h1 - h0) * groups * (r1 - r0) * width].view(h1 - h0, groups * (r1 - r0), width)
            _tile_scores(scores, q3, keys, (h0, h1), (r0, r1), n, groups, causal, offset, pad, hidden)
            heads_q = slice(h0 * groups, h1 * groups)
            if compiled:  # straight into the results' rows (the kernel adds each head's base)
                native.row_topk_(
                    scores.view(-1, r1 - r0, width), kk, top[heads_q, r0:r1], idx[heads_q, r0:r1], groups, lk, h0 * lk
                )
            else:
                _keep(_row_topk(scores, kk, s), top[heads_q, r0:r1], idx[heads_q, r0:r1], groups, base[h0:h1])
    return top, idx


# Bytes of a compiled tile's scores: the product writes them and the kernel reads them while they
# are in the last-level cache (32 MiB on the EPYC measured). 16K causal fwd, 2 threads: the
# product and the selection took 4.2-4.4 s on tiles of one or two heads (32 MiB), 5.0 s on all
# 12 heads (384 MiB).
TILE_BYTES = 32 << 20


def _heads_per_tile(heads: int, bytes_per_head: int, compiled: bool) -> int:
    """K/V heads per score tile: all for ``torch.topk`` (few, large ops), as fit :data:`TILE_BYTES` compiled."""
    return max(1, min(heads, TILE_BYTES // max(1, bytes_per_head))) if compiled else heads


def _tile_scores(scores, q3, keys, heads, rows, n, groups, causal, offset, pad, hidden):
    """Fill ``scores [h1 - h0, G·(r1 - r0), width]`` with the queries' products with the keys, masked.

    ``heads = (h0, h1)``: K/V heads; ``rows = (r0, r1)``: query positions (a row per query head of a
    group and position); ``n`` keys are visible to the tile; ``hidden``: a cache of causal masks.
    """
    (h0, h1), (r0, r1) = heads, rows
    lq, d = q3.shape[1:]
    lk, width = keys.shape[1], scores.shape[-1]
    if groups == 1:
        tile_q = q3[h0:h1, r0:r1]
    else:
        tile_q = q3.view(-1, groups, lq, d)[h0:h1, :, r0:r1].reshape(h1 - h0, groups * (r1 - r0), d)
    torch.matmul(tile_q.to(scores.dtype), keys[h0:h1, :width].transpose(1, 2), out=scores)
    grouped = scores if groups == 1 else scores.view(h1 - h0, groups, r1 - r0, width)
    # Columns some row of the tile must not see, from ``lo`` on: future keys (and, when
    # ``n < width``, the keys past the tile). Row r sits at position p = offset + r and sees keys j <= p.
    p0, p1 = offset + r0, offset + r1
    lo = min(max(p0, 0), n) if causal else width
    if lo < width:
        key = (p0 - lo, p1 - lo, width - lo)
        if key not in hidden:
            allowed = allowed_keys(r0, r1, lq, lk, causal=causal, device=scores.device, cols=(lo, width))
            hidden[key] = allowed.logical_not_()
        grouped[..., lo:].masked_fill_(hidden[key], float("-inf"))
    if pad is not None:
        grouped.masked_fill_(pad[h0:h1, ..., :width], float("-inf"))


def _keep(selected, top, idx, groups, base):
    """Store :func:`_row_topk`'s values and columns of K/V heads (rows ``[h, G·R]``) into ``top``, ``idx``
    (``[h·G, R, k]`` slices), the columns as global key rows: plus ``base [h, 1, 1, 1]``, each head's first."""
    values, where = selected
    heads, kk = where.shape[0], where.shape[-1]
    rows = idx.shape[1]
    top.view(heads, groups, rows, kk).copy_(values.view(heads, groups, rows, kk))
    torch.add(where.view(heads, groups, rows, kk), base, out=idx.view(heads, groups, rows, kk))


def _decode(q, k, v, causal, relu, kk, real_keys, groups, float_scores=False):
    """Forward only, few query rows (:mod:`topk_bench.attention.shared.decode`): all scores, then the row top-k.

    The compiled kernel (:mod:`topk_bench.attention.kernels.native`, CPU) on the scores as they are (half ones
    too); else pruned as :func:`_row_topk` with runs of ``s`` consecutive keys as the groups (the top-k lies in
    the k runs with the largest maxima): a run's members are adjacent, so
    the candidates are ``k`` rows of a ``[runs, s]`` view, copied by one ``index_select``
    (measured 1.8 ms for 512 rows x 128 runs of 8; the element-wise ``gather`` that
    strided groups need takes 7.5 ms for the same entries).
    """
    if real_keys is None and triton_decode.topk_fast_unsupported(q, k, v, key_padding_mask=None) is None:
        return triton_decode.topk_fast_decode(q, k, v, causal=causal, relu=relu, topk=kk, float_scores=float_scores)
    lk = k.shape[-2]
    # The compiled top-k takes the scores as they are (half ones ranked by their ordered bits, as :func:`_ranks`).
    score_dtype = stat_dtype(q.dtype) if float_scores else q.dtype
    compiled = native.available(score_dtype, device_kind(q))
    s = 1 if compiled else _segments(max(lk, kk), kk)
    scores = decode_scores(q, k, groups, causal=causal, real_keys=real_keys, multiple=s, float_scores=float_scores)
    rows, width = scores.shape[-2:]
    dtype = scores.dtype
    if compiled:
        top = scores.new_empty(*scores.shape[:-1], kk)
        where = torch.empty(*scores.shape[:-1], kk, dtype=torch.int64, device=scores.device)
        native.row_topk_(scores.view(-1, rows, width), kk, top.view(-1, rows, kk), where.view(-1, rows, kk))
        del scores
    else:
        # Converted once (:func:`_ranks`): the runs' maxima, copies and top-k all run on the ranks
        # (bf16, 131072 keys: the maxima of runs of 4 take 1.0 ms on int16 bits, 3.3 ms on bf16).
        ranks = _ranks(scores)
        del scores
        if s == 1:
            top, where = ranks.topk(kk, dim=-1, sorted=False)
        else:
            runs = ranks.view(-1, s)  # [rows * width/s, s]
            best = runs.amax(dim=-1).view(-1, rows, width // s).topk(kk, dim=-1, sorted=False).indices  # [.., k]
            first = torch.arange(0, best.shape[0] * rows * (width // s), width // s, device=best.device)
            members = runs.index_select(0, (best + first.view(best.shape[0], rows, 1)).view(-1))  # [.. * k, s]
            top, pos = members.view(*best.shape[:-1], kk * s).topk(kk, dim=-1, sorted=False)
            where = best.gather(-1, torch.div(pos, s, rounding_mode="floor")) * s + pos % s
            del runs, best, first, members, pos
        del ranks
        top = _scores(top, dtype)
    if width > lk:  # padding columns are only picked with -inf (zero weight): keep them in range
        where.clamp_(max=lk - 1)
    weights = _activate(
        upcast(top), relu, rows_may_be_empty(q.shape[-2], lk, causal=causal, padded=real_keys is not None)
    )
    # The batched CUDA path (:mod:`topk_bench.attention.shared.cuda_torch`): copies and one bmm, not embedding_bag.
    return (gathered_output if cuda_torch.batched(q) else decode_output)(weights, where, q, v)


def _backward_group(dout_g, q_g, k2, v2, top, idx, relu, keys, grads, safe=False, keep=None, dropout=0.0):
    """Gradients of one group of heads (``dout_g, q_g``: its rows; ``k2, v2``: all heads' keys).

    ``idx`` holds global key rows ``h·Lk + j``; ``keys``: the group's range of them, ``(lo, hi)`` for the
    compiled key sort (:func:`_transposed_bags_compiled`), else a tensor of them (torch.sort's path).
    ``keep``: the forward's dropout masks of the group (``None`` without dropout).
    """
    dq, dk, dv = grads
    rows, kk = dout_g.shape[0], top.shape[-1]
    device, index_dtype = idx.device, idx.dtype
    flat = idx.reshape(-1)
    weights = _activate(top, relu, safe).view(rows, kk)
    if dropout:  # the forward's masks, applied with the same rounding (as ``topk``)
        keep = keep.reshape(rows, kk)
        dropped = weights * keep / (1.0 - dropout)
    else:
        dropped = weights
    offsets = torch.arange(0, rows * kk, kk, dtype=index_dtype, device=device)
    bag_of = torch.arange(rows, dtype=index_dtype, device=device).repeat_interleave(kk)
    # dW[r, t] = dout[r] · V[idx[r, t]]: the per-sample-weights gradient of out = bag(W, V).
    ds = upcast(cuda_torch.per_sample_weights_backward(dout_g, v2, flat, offsets, bag_of)).view(rows, kk)
    del bag_of, offsets
    if dropout:  # ds was the gradient w.r.t. the dropped weights
        ds = ds * keep / (1.0 - dropout)
    if relu:
        ds.masked_fill_(top.view(rows, kk) <= 0, 0.0)
    else:
        ds.sub_((ds * weights).sum(-1, keepdim=True)).mul_(weights)
    ds = ds.to(k2.dtype)  # the bags' weights in the input dtype (no copy in float32)
    if dq is not None:
        dq.copy_(F.embedding_bag(flat.view(rows, kk), k2, per_sample_weights=ds, mode="sum"))
    if dk is None and dv is None:
        return
    # The transposed selection: entries sorted by key, one bag of query rows per key
    # (empty bags give zero rows); one sort serves both dV and dK.
    if isinstance(keys, tuple):
        _transposed_bags_compiled(flat, keys, kk, dropped, ds, dout_g, q_g, dk, dv)
        return
    # Else a 1-D torch.sort (the batched per-head sort measured 1.7x slower) and searchsorted against
    # ``keys``, a tensor: CUDA, and CPU without the compiled kernels. Written here, not in a function
    # of its own: its allocations, and the order they are freed in, are the ones the H100 measured
    # (tests/data/h100-ci*.csv, reserved bytes included).
    sorted_keys, order = torch.sort(flat)
    starts = torch.searchsorted(sorted_keys, keys)
    del sorted_keys
    query_of = order >> (kk.bit_length() - 1) if kk & (kk - 1) == 0 else torch.div(order, kk, rounding_mode="floor")
    # index_select: ~4x faster than advanced indexing for these permutations.
    if dv is not None:
        w_sorted = dropped.reshape(-1).index_select(0, order).to(dout_g.dtype)
        dv.copy_(F.embedding_bag(query_of, dout_g, starts, per_sample_weights=w_sorted, mode="sum"))
    if dk is not None:
        ds_sorted = ds.view(-1).index_select(0, order)
        dk.copy_(F.embedding_bag(query_of, q_g, starts, per_sample_weights=ds_sorted, mode="sum"))


def _transposed_bags_compiled(flat, keys, kk, dropped, ds, dout_g, q_g, dk, dv):
    """dV and dK through the compiled key sort (:mod:`topk_bench.attention.kernels.native`, CPU): the entries by key
    with their
    query rows and weights carried along (16K causal backward: 0.82 s of sort, searchsorted and index_select
    against ~0.25 s). ``keys = (lo, hi)``: the group's range of key rows."""
    lo, hi = keys
    device = flat.device
    query_of = torch.empty(flat.numel(), dtype=torch.int64, device=device)
    starts = torch.empty(hi - lo + 1, dtype=torch.int64, device=device)
    w = dropped.reshape(-1).to(dout_g.dtype) if dv is not None else None
    dsw = ds.view(-1) if dk is not None else None
    w_sorted, ds_sorted = (None if t is None else torch.empty_like(t) for t in (w, dsw))
    native.key_sort_(flat, lo, kk, query_of, starts, w, w_sorted, dsw, ds_sorted)
    # Offsets without the last (the end): with include_last_offset=True the meta kernel's bag sizes
    # hold one entry more than the CPU kernel's (8 bytes off the predicted peak).
    starts = starts[:-1]
    if dv is not None:
        dv.copy_(F.embedding_bag(query_of, dout_g, starts, per_sample_weights=w_sorted, mode="sum"))
    if dk is not None:
        dk.copy_(F.embedding_bag(query_of, q_g, starts, per_sample_weights=ds_sorted, mode="sum"))


class _TopkFast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, relu, topk, chunk_size, real_keys, dropout, groups, float_scores):
        lead, lq, lk, dv = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
        kk = min(topk, lk)
        q3, k3 = q.reshape(-1, lq, q.shape[-1]), k.reshape(-1, lk, k.shape[-1])
        bh = q3.shape[0]
        real = None
        if real_keys is not None:  # [B, Lk] -> one row per K/V (batch, head, ...): [bkv, 1, Lk]
            kv_lead = k.shape[:-2]
            shape = (kv_lead[0],) + (1,) * (len(kv_lead) - 1) + (lk,)
            real = real_keys.view(shape).expand(*kv_lead, lk).reshape(k3.shape[0], 1, lk)
        top, idx = _select(q3, k3, causal, kk, chunk_size, real, groups, float_scores)
        del real
        safe = rows_may_be_empty(lq, lk, causal=causal, padded=real_keys is not None)
        weights = _activate(top, relu, safe)
        keep = None
        if dropout:
            # Drawn per chunk of ``chunk_size`` query rows, one [bh, C, k] draw each: the same
            # draws, in the same order, as ``topk`` (whose k slots are ordered differently).
            keep = torch.empty(bh, lq, kk, dtype=torch.bool, device=q.device)
            for s in range(0, lq, chunk_size):
                e = min(s + chunk_size, lq)
                torch.ge(torch.rand(bh, e - s, kk, dtype=weights.dtype, device=q.device), dropout, out=keep[:, s:e])
            weights = weights * keep / (1.0 - dropout)
        out = F.embedding_bag(
            idx.view(-1, kk), v.reshape(-1, dv), per_sample_weights=weights.to(v.dtype).view(-1, kk), mode="sum"
        )
        ctx.save_for_backward(q, k, v, top, idx, keep)
        ctx.relu = relu
        ctx.safe = safe
        ctx.dropout = dropout
        ctx.groups = groups
        return out.view(*lead, lq, dv)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, top, idx, keep = ctx.saved_tensors
        bh, lq, kk = top.shape
        lk = k.shape[-2]
        groups = ctx.groups
        bkv = bh // groups
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dout2 = dout.reshape(bh * lq, dout.shape[-1]).contiguous()
        q2 = q.reshape(bh * lq, q.shape[-1]).contiguous()
        k2 = k.reshape(bkv * lk, k.shape[-1]).contiguous()
        v2 = v.reshape(bkv * lk, v.shape[-1]).contiguous()
        dq = torch.empty_like(q2) if need_q else None
        dk = torch.empty_like(k2) if need_k else None
        dv = torch.empty_like(v2) if need_v else None
        # Groups of whole K/V heads, each with its G query heads (rows h*G .. h*G + G - 1),
        # so that every key's gradient comes from one group.
        entries = cuda_torch.BACKWARD_ENTRIES if cuda_torch.batched(idx) else BACKWARD_ENTRIES
        heads = max(1, min(bkv, entries // max(1, groups * lq * kk)))
        compiled = native.built(device_kind(idx))
        key_ids = None if compiled else torch.arange(bkv * lk, dtype=idx.dtype, device=idx.device)
        for h0 in range(0, bkv, heads):
            h1 = min(h0 + heads, bkv)
            g0, g1 = h0 * groups, h1 * groups
            qs, ks = slice(g0 * lq, g1 * lq), slice(h0 * lk, h1 * lk)
            _backward_group(
                dout2[qs],
                q2[qs],
                k2,
                v2,
                top[g0:g1],
                idx[g0:g1],
                ctx.relu,
                (ks.start, ks.stop) if compiled else key_ids[ks],
                tuple(None if g is None else g[r] for g, r in ((dq, qs), (dk, ks), (dv, ks))),
                ctx.safe,
                None if keep is None else keep[g0:g1],
                ctx.dropout,
            )
        return (
            dq.view(q.shape) if need_q else None,
            dk.view(k.shape) if need_k else None,
            dv.view(v.shape) if need_v else None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def topk_fast_attention(
    q,
    k,
    v,
    *,
    causal=False,
    activation="softmax",
    topk=128,
    chunk_size=1024,
    key_padding_mask=None,
    dropout=0.0,
    float_scores=False,
):
    """``activation(top-k(q kᵀ)) v``: the same result as ``topk`` (half inputs: ``float_scores=True``), computed
    sparsely.

    Rows with fewer than ``topk`` allowed keys give the masked keys zero weight;
    ``key_padding_mask`` (bool ``[B, Lk]``, True = padding) masks keys, and a row
    with no allowed key gives zeros. ``dropout`` drops attention weights with masks
    drawn per chunk in forward and reused by backward (as ``topk``).
    ``float_scores`` (half inputs): False ranks keys by their product in the input dtype,
    rounded as dense attention in that dtype rounds its scores (one half-precision GEMM
    over a decode step's cache); True by float32 scores (the keys float32 inputs would
    pick, as ``topk``), from float32 copies of the keys.
    """
    check_activation(activation)
    groups = check_qkv(q, k, v)
    check_topk_args(q, k, topk, chunk_size, dropout, key_padding_mask)
    real_keys = from_padding(key_padding_mask)
    if use_decode_path(q, k, v, chunk_size, dropout):
        return _decode(
            q,
            k,
            v,
            bool(causal),
            activation == "relu",
            min(int(topk), k.shape[-2]),
            real_keys,
            groups,
            bool(float_scores),
        )
    if triton_kernels.unsupported(q, k, v, topk=topk, dropout=dropout, key_padding_mask=key_padding_mask) is None:
        return triton_kernels.topk_attention(
            q, k, v, causal=causal, relu=activation == "relu", topk=topk, groups=groups, float_scores=float_scores
        )
    return _TopkFast.apply(
        q,
        k,
        v,
        bool(causal),
        activation == "relu",
        int(topk),
        int(chunk_size),
        real_keys,
        float(dropout),
        groups,
        bool(float_scores),
    )


TOPK_FAST = register(
    Implementation(
        name="topk_fast",
        machine_choices=("native_kernels", "half_products", "decode_tiles", "triton_kernels", "cuda_torch"),
        fn=topk_fast_attention,
        description="top-k attention with causal key skipping, pruned top-k and k-sparse products",
        options={**TOPK_OPTIONS, "float_scores": False},
        label="Top-k fast (size={chunk_size}, topk={topk})",
        # Same results as ``topk`` (which is not vanilla attention); half inputs: ``float_scores=True``.
        exact=False,
        key_padding_mask=True,
        gqa="native",
        selection=functools.partial(topk_selection, float_scores=False),  # ranked as the function ranks
        budget=topk_budget,
    )
)
