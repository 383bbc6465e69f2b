"""Attention sinks plus a sliding window: StreamingLLM ("Efficient Streaming Language Models
with Attention Sinks", Xiao et al., ICLR 2024), written from its published description.

Each query attends exactly (one softmax) to the first ``sinks`` tokens of the cache
and to the last ``window`` tokens up to and including its own position. Query ``i``
sits at position ``p = Lk - Lq + i`` (bottom-right alignment, as a KV cache), so its
keys are ``j < sinks`` and ``p - window < j <= p``. Causal masking only matters for
the sinks (a query before position ``sinks`` does not see the later sinks); the
window never reaches past the query, so ``causal=False`` gives the same keys except
that all sinks are visible. Overlapping sinks and window count each key once; a row
with no key (causal, ``p < 0``) gives zeros.

Grouped-query heads: native, the ``G = Hq // Hkv`` query heads of a kv head are
stacked as rows of one product with that head's keys (no repeated K/V).
Dtypes: products in the input dtype, softmax in float32 for half inputs, output in
the input dtype. Plain autograd ops on slices (differentiable, shape-static: runs
under ``FakeTensorMode``); ``ROWS`` query rows at a time, so the score tiles are
``ROWS x (sinks + window + ROWS)``, never ``Lq x Lk``.
"""

from __future__ import annotations

import torch

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.masking import (
    allowed_keys,
    check_activation,
    check_qkv,
    group_rows,
    query_positions,
    safe_softmax,
    stat_dtype,
    unfold_groups,
)

OPTIONS = {"sinks": 4, "window": 1024}
ROWS = 256  # query rows per tile


def _check(sinks, window):
    if sinks < 0 or window < 0:
        raise ValueError(f"sink_window needs sinks >= 0 and window >= 0, got sinks={sinks}, window={window}")


def _tile(q, k, v, r0, r1, lq, causal, sinks, window):
    """Output rows ``r0 <= i < r1``: one softmax over the sink keys and the window band of the tile."""
    b, hq, _, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    device = q.device
    c = r1 - r0
    pos = query_positions(r0, r1, lq, lk, device).view(c, 1)
    s = min(sinks, lk)
    # The band: every key some row of the tile has in its window, minus the sinks.
    lo, hi = max(s, lk - lq + r0 - window + 1, 0), max(min(lk, lk - lq + r1), 0)
    hi = max(hi, lo)
    if s + hi - lo == 0:  # no key for any row of the tile (sinks = window = 0, or rows before the keys)
        return q.new_zeros(b, hq, c, v.shape[-1])
    g = hq // hkv
    qg = group_rows(q, g, r0, r1)  # [B, Hkv, G*C, d]
    sink_cols = torch.arange(s, device=device)
    band_cols = torch.arange(lo, hi, device=device)
    sink_ok = sink_cols <= pos if causal else torch.ones(c, s, dtype=torch.bool, device=device)
    band_ok = (band_cols <= pos) & (band_cols > pos - window)
    allowed = torch.cat((sink_ok, band_ok), dim=-1)  # [C, s + band]
    # Two products (sinks, band) rather than one over concatenated keys: no copy of the band.
    # Keys on the left ([n, d] @ [d, G*C]): a key slice is not contiguous across heads, and
    # this orientation measured ~3x faster than q @ kᵀ on it at decode (bf16, CPU).
    qt = qg.transpose(-2, -1)
    scores = torch.cat(((k[:, :, :s] @ qt).transpose(-2, -1), (k[:, :, lo:hi] @ qt).transpose(-2, -1)), dim=-1)
    scores = scores.view(b, hkv, g, c, -1).to(stat_dtype(q.dtype))
    w = safe_softmax(scores, allowed).to(v.dtype).view(b, hkv, g * c, -1)
    out = w[..., :s] @ v[:, :, :s] + w[..., s:] @ v[:, :, lo:hi]
    return unfold_groups(out, g)


def sink_window_attention(q, k, v, *, causal=False, activation="softmax", sinks=4, window=1024):
    """StreamingLLM attention: the first ``sinks`` keys plus the last ``window`` keys up to each query."""
    check_activation(activation, "sink_window", ("softmax",))
    check_qkv(q, k, v, batched=True)
    sinks, window = int(sinks), int(window)
    _check(sinks, window)
    lq = q.shape[2]
    tiles = [_tile(q, k, v, r0, min(r0 + ROWS, lq), lq, causal, sinks, window) for r0 in range(0, lq, ROWS)]
    return tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=2)


def sink_window_selection(q, k, *, causal=False, sinks=4, window=1024, **_ignored):
    """Bool ``[B, Hq, Lq, Lk]``: the keys :func:`sink_window_attention` attends to (True = attended)."""
    check_qkv(q, k, k, batched=True)
    sinks, window = int(sinks), int(window)
    _check(sinks, window)
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    cols = torch.arange(lk, device=q.device)
    pos = query_positions(0, lq, lq, lk, q.device).unsqueeze(1)
    keys = (cols < sinks) & (allowed_keys(0, lq, lq, lk, causal=True, device=q.device) if causal else True)
    keys = keys | ((cols <= pos) & (cols > pos - window))
    return keys.expand(b, hq, lq, lk).clone()


SINK_WINDOW = register(
    Implementation(
        name="sink_window",
        fn=sink_window_attention,
        description="StreamingLLM: the first `sinks` keys plus a sliding window of `window` keys, exact softmax",
        options=OPTIONS,
        label="Sinks + window (sinks={sinks}, window={window})",
        activations=("softmax",),
        exact=False,
        gqa="native",
        selection=sink_window_selection,
        budget=lambda tokens, options: {"window": max(1, int(tokens) - int(options["sinks"]))},
    )
)
