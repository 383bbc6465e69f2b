"""The costs of implementations/'s custom ops (its Triton kernels), for the GPU time model
(:func:`topk_bench.predict.timing.register_cost`): ``torch.utils.flop_counter`` knows no custom op, and
implementations/ imports nothing of the harness, so they are declared here, by the op's qualified name.

Each rule reads the call's shapes as the op's docstring states them (``q [heads, Lq, D]``, ``k``/``v``
``[kv_heads, Lk, D]``, ``indices [heads, Lq, kk]``) and counts what its kernel does: the FLOPs of the products it
computes, the bytes it reads and writes (the selected K/V rows, not the whole K/V), and its grid (the programs
``implementations/triton_kernels/__init__.py`` launches). A new kernel there gets a rule here; until then its
time is its bytes at the elementwise kernels' rate, and the prediction warns that it is.
"""

from __future__ import annotations

from implementations.triton_kernels import BLOCK_M as SELECT_ROWS  # query rows of one selection program
from topk_bench.predict.timing import ATTENTION_BWD, ATTENTION_FWD, Cost, causal_share, nbytes, register_cost


def _shapes(q, k, indices):
    heads, lq, d = q.shape
    return heads, lq, d, k.shape[1], indices.shape[-1]


def _causal(lq: int, lk: int, causal: bool) -> float:
    return causal_share(lq, lk) if causal else 1.0


@register_cost("implementations::triton_topk_select_")
def topk_select(args, kwargs) -> Cost:
    """Every score of a block of query rows (QK^T on chip, causal tiles skipped), the row top-k kept in
    registers: the FLOPs of the full product; reads Q and K (K once per block of rows, from L2 after the first:
    counted once), writes the indices."""
    q, k, indices, causal = args[:4]
    heads, lq, d, lk, _ = _shapes(q, k, indices)
    flops = 2.0 * heads * lq * lk * d * _causal(lq, lk, causal)
    blocks = -(-lq // SELECT_ROWS) * heads
    return Cost(ATTENTION_FWD, flops, nbytes(q) + nbytes(k) + nbytes(indices), blocks)


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
    return Cost(ATTENTION_FWD, flops, moved, q.shape[0] * q.shape[1])


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
    return Cost(ATTENTION_BWD, flops, moved, q.shape[0] * q.shape[1])
