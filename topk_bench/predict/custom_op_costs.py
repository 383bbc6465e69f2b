"""The costs of topk_bench/attention/'s custom ops (its Triton kernels), for the GPU time model
(:func:`topk_bench.predict.cost_rules.register_cost`): ``torch.utils.flop_counter`` knows no custom op, and
topk_bench/attention/ imports nothing of the harness, so they are declared here, by the op's qualified name.

Each rule reads the call's shapes as the op's docstring states them (``q [heads, Lq, D]``, ``k``/``v``
``[kv_heads, Lk, D]``, ``indices [heads, Lq, kk]``) and counts what its kernel does: the FLOPs of the products it
computes, the bytes it reads and writes (the selected K/V rows, not the whole K/V), and its grid (the launcher's
own grid function: ``select_grid``, ``split_grid``...) with the constants the kernels run by (the row top-k's
passes and digits). A new kernel there gets a rule here; until then its time is its bytes at the elementwise
kernels' rate, and the prediction warns that it is.
"""

from __future__ import annotations

import math

from topk_bench.aten_ops import KernelClass
from topk_bench.attention.kernels import triton as training
from topk_bench.attention.kernels.triton import decode
from topk_bench.attention.kernels.triton.launch import cdiv
from topk_bench.attention.shared.masking import causal_offset
from topk_bench.predict.cost_rules import Cost, causal_share, nbytes, register_cost


def _shapes(q, k, indices):
    heads, lq, d = q.shape
    return heads, lq, d, k.shape[1], indices.shape[-1]


def _causal(lq: int, lk: int, causal: bool) -> float:
    """The share of the scores the Triton kernels' causal mask keeps: bottom-right aligned, as the registry's."""
    return causal_share(lq, lk, offset=causal_offset(lq, lk)) if causal else 1.0


def expected_candidates(seen: float, kk: int) -> float:
    """Keys a row appends to its candidate buffer when it walks ``seen`` keys for its top-``kk``, scores in random
    order: all of the first ``kk``, then the i-th key with probability ``kk / i`` (it beats the running ``kk``-th):
    ``kk (1 + ln(seen / kk))``. Walking from the diagonal, keys nearer a query usually score higher: fewer."""
    return float(seen) if seen <= kk else kk * (1.0 + math.log(seen / kk))


@register_cost("implementations::triton_topk_select_")
def topk_select(args, kwargs) -> Cost:
    """Every score of a tile of query rows (QK^T on chip, causal blocks skipped) compared once with its row's
    threshold: the FLOPs of the full product; reads Q and K (K once per tile, from L2 after the first: counted
    once), writes the indices, and each row's candidates (:func:`expected_candidates`, int64) written once and read
    back once (the cuts' other reads hit L1). Grid: the persistent programs (:func:`select_grid`)."""
    q, k, indices, causal = args[:4]
    heads, lq, d, lk, kk = _shapes(q, k, indices)
    share = _causal(lq, lk, causal)
    flops = 2.0 * heads * lq * lk * d * share
    candidates = 2 * 8 * heads * lq * expected_candidates(lk * share, kk)
    moved = nbytes(q) + nbytes(k) + nbytes(indices) + candidates
    return Cost(KernelClass.ATTENTION_FWD, flops, moved, math.prod(training.select_grid(heads, lq)))


def _gathered(q, k, v, indices) -> tuple[float, float]:
    """(FLOPs of the selected scores and their product with V, bytes of the selected K and V rows)."""
    heads, lq, d, _, kk = _shapes(q, k, indices)
    dv = v.shape[-1]
    return 2.0 * heads * lq * kk * (d + dv), float(heads * lq * kk * (d * k.element_size() + dv * v.element_size()))


@register_cost("implementations::triton_gathered_forward_")
def gathered_forward(args, kwargs) -> Cost:
    """One program per query row: its ``kk`` selected K and V rows read, scored, softmaxed, summed."""
    q, k, v, indices, out, lse = args[:6]
    flops, rows = _gathered(q, k, v, indices)
    moved = nbytes(q) + nbytes(indices) + rows + nbytes(out) + nbytes(lse)
    return Cost(KernelClass.ATTENTION_FWD, flops, moved, math.prod(training.gathered_grid(*q.shape[:2])))


@register_cost("implementations::triton_gathered_backward_")
def gathered_backward(args, kwargs) -> Cost:
    """One program per query row: the scores again (QK^T), dP = dO V^T, dQ = dS K, dK += dS^T q, dV += P^T dO
    over its ``kk`` selected rows; dK and dV added atomically into float32 accumulators (read and written)."""
    q, k, v, indices, out, dout, lse, dq, dk, dv = args[:10]
    _, rows = _gathered(q, k, v, indices)
    heads, lq, d, _, kk = _shapes(q, k, indices)
    flops = 2.0 * heads * lq * kk * (3 * d + 2 * v.shape[-1])
    atomics = 2.0 * heads * lq * kk * (d * dk.element_size() + v.shape[-1] * dv.element_size())
    moved = sum(nbytes(t) for t in (q, indices, out, dout, lse, dq)) + rows + atomics
    return Cost(KernelClass.ATTENTION_BWD, flops, moved, math.prod(training.gathered_grid(*q.shape[:2])))


# -- decode steps (topk_bench/attention/kernels/triton/decode.py): one op, a chain of launches -----------------------

# The row top-k's work, in integer instructions a thread issues (decode_kernels.py), declared as FLOPs at 4 FLOPs
# an instruction: an SM of sm_80/sm_90 issues 64 int32 results a clock against 128 fp32 FMAs (2 FLOPs each), and
# the selection class is costed at the fp32 peak.
_INT_OP_FLOPS = 4.0
# One program a row (row_topk_kernel): ROW_TOPK_PASSES radix passes, a count and a write, each a walk over the row
# in steps of SELECT_BLOCK columns, every step waiting for its load (the running counts carry from step to step).
# Per column and walk, its key (load, widen, bitcast, shift, and, xor, sign-extend, 64-bit add: 8); per column
# and candidate digit of a radix pass, an int64 compare and a count (two compares, a select, an add: 4).
_KEY_OPS, _COMPARE_OPS = 8, 4
# Many programs a row (the radix kernels, each program one chunk): per column, its 32-bit key (6), and in a
# histogram pass the prefix test and the digit (5) and a shared-memory atomic (4); in the count two compares and
# two sums (6); in the write the compares, two prefix sums and the store (14). Per program, its threshold from
# the row's histograms: per histogram, about 10 instructions a bin (a prefix sum, two compares, two sums).
_RADIX_KEY_OPS, _HISTOGRAM_OPS, _COUNT_OPS, _WRITE_OPS, _BIN_OPS = 6, 9, 6, 14, 10


def row_topk_costs(scores, idx) -> tuple[Cost, ...]:
    """The row top-k as :func:`topk_bench.attention.kernels.triton.decode.row_topk` runs it: one program a row
    (``ROW_TOPK_WALKS`` walks over the row, each a serial loop of loads) or the radix select's launches of one
    program per (row, chunk), each reading its chunk once and waiting on one load (the write: and on the earlier
    chunks' counts, ``PRIOR_CHUNKS`` at a time)."""
    width = scores.shape[1]
    rows, chunks = decode.row_topk_grid(scores.shape[0], width)
    if chunks == 1:  # one program a row
        walks = decode.ROW_TOPK_WALKS
        per_column = walks * _KEY_OPS + decode.ROW_TOPK_PASSES * decode.ROW_TOPK_DIGITS * _COMPARE_OPS
        steps = walks * cdiv(width, decode.SELECT_BLOCK)
        flops = _INT_OP_FLOPS * per_column * rows * width
        return (Cost(KernelClass.SELECTION, flops, walks * nbytes(scores) + nbytes(idx), rows, round_trips=steps),)
    programs = rows * chunks
    bins, passes = decode.RADIX_BINS, decode.RADIX_PASSES
    columns = float(rows * width)

    def launch(ops_per_column: int, histograms: int, moved: float, round_trips: int = 1) -> Cost:
        ops = ops_per_column * columns + _BIN_OPS * bins * histograms * programs
        return Cost(KernelClass.SELECTION, _INT_OP_FLOPS * ops, moved, programs, round_trips=round_trips)

    counts = 2 * 4 * programs  # (above, equal) int32 per chunk
    chain = [
        launch(_RADIX_KEY_OPS + _HISTOGRAM_OPS, p, nbytes(scores) + 4 * bins * (p + 1) * programs)
        for p in range(passes)
    ]
    histograms = 4 * bins * passes * programs
    chain.append(launch(_RADIX_KEY_OPS + _COUNT_OPS, passes, nbytes(scores) + histograms + counts))
    prior_steps = cdiv(chunks - 1, decode.PRIOR_CHUNKS)
    moved = nbytes(scores) + histograms + counts * chunks / 2 + nbytes(idx)  # a chunk reads the counts before it
    chain.append(launch(_RADIX_KEY_OPS + _WRITE_OPS, passes, moved, round_trips=1 + prior_steps))
    return tuple(chain)


def _combine(acc, stats, out) -> Cost:
    """The splits' partial sums and statistics read once, the output written (one program per row)."""
    moved = nbytes(acc) + nbytes(stats) + nbytes(out)
    return Cost(KernelClass.ELEMENTWISE, float(acc.numel() * 2), moved, math.prod(decode.combine_grid(acc.shape[0])))


@register_cost("implementations::triton_page_decode_")
def page_decode(args, kwargs) -> tuple[Cost, ...]:
    """Bounds (when pages are picked), the row top-k of the bounds, split-KV attention over each row's picked
    pages and its own, the combine. The attention reads only the picked pages' K and V rows."""
    q, k, v, summaries, bounds, table, _select, acc, stats, out, causal, page_size = args[:12]
    b, hq, lq, d = q.shape
    hkv, dv = k.shape[1], v.shape[-1]
    rows, n = table.shape
    if rows == 0:
        return ()
    per = hq // (rows // (b * lq))  # query heads one table row serves
    keys = (n + 1) * page_size  # a row's picked pages and its own
    flops = 2.0 * rows * per * keys * (d + dv)
    pages = rows * keys * (d * k.element_size() + dv * v.element_size())
    moved = nbytes(q) + nbytes(table) + pages + nbytes(acc) + nbytes(stats)
    attention = Cost(KernelClass.ATTENTION_FWD, flops, moved, math.prod(decode.split_grid(rows, acc.shape[1])))
    chain = [attention, _combine(acc, stats, out)]
    if n:
        # Each bound: over d, the larger of q times the page's minimum and maximum, summed (3 FLOPs a term).
        programs = math.prod(decode.bounds_grid(b, hkv, summaries.shape[2]))
        moved = nbytes(q) + nbytes(summaries) + nbytes(bounds)
        bounding = Cost(KernelClass.ELEMENTWISE, 3.0 * bounds.numel() * d, moved, programs)
        chain = [bounding, *row_topk_costs(bounds, table), *chain]
    return tuple(chain)


@register_cost("implementations::triton_topk_decode_")
def topk_decode(args, kwargs) -> tuple[Cost, ...]:
    """Every score of the step, the row top-k of the scores, the selected scores' softmax times their gathered V
    rows split across programs, the combine."""
    q, k, v, scores, idx, _select, acc, stats, out = args[:9]
    if scores.numel() == 0:
        return ()
    b, hq, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    programs = math.prod(decode.scores_grid(b, hq, hkv, lq, lk))
    scoring = Cost(KernelClass.GEMM, 2.0 * b * hq * lq * lk * d, nbytes(q) + nbytes(k) + nbytes(scores), programs)
    rows, kk = idx.shape
    picked = rows * kk * (scores.element_size() + dv * v.element_size())
    moved = nbytes(idx) + picked + nbytes(acc) + nbytes(stats)
    gathered = Cost(
        KernelClass.ATTENTION_FWD, 2.0 * rows * kk * dv, moved, math.prod(decode.split_grid(rows, acc.shape[1]))
    )
    return (scoring, *row_topk_costs(scores, idx), gathered, _combine(acc, stats, out))
