"""One step of the online softmax over gathered keys (flash attention's running maximum and sum), shared by the
training forward and the decode splits."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(m, total, acc, s, vr):
    """The running maximum ``m``, sum ``total`` and weighted sum ``acc [DV]`` after the scores ``s [N]`` of the
    rows ``vr [N, DV]`` (``-inf``: a key not attended); a row that has seen only ``-inf`` keeps zeros."""
    m_new = tl.maximum(m, tl.max(s, axis=0))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf
    alpha = tl.exp(m - shift)
    p = tl.exp(s - shift)
    return m_new, total * alpha + tl.sum(p, axis=0), acc * alpha + tl.sum(p[:, None] * vr, axis=0)
