"""Native Sparse Attention (NSA; Yuan et al., 2025, "Native Sparse Attention: Hardware-Aligned and
Natively Trainable Sparse Attention", arXiv:2502.11089), written from its published description.

Each query attends through three branches whose outputs a learned sigmoid gate mixes (paper Eq. 5):

    out = g_cmp * attn(q, K_cmp, V_cmp) + g_slc * attn(q, K_slc, V_slc) + g_win * attn(q, K_win, V_win)

1. **Compression** (Eq. 7): blocks of ``compress_block`` (``l``) consecutive keys, one every
   ``compress_stride`` (``d``) keys (block ``i`` covers keys ``i*d .. i*d + l - 1``), each compressed
   into one key and one value. The paper's φ is a learnable MLP with an intra-block position
   encoding; here φ is **mean pooling** of the block's keys (values) [NSA-D1], the parameter-free form that
   public NSA re-implementations train with (fla-org/native-sparse-attention). It keeps the
   compressed cache a function of K/V alone, so a decode step reads it kept with the cache
   (``compressed_k``/``compressed_v``, the registry's ``cache_state``) as serving keeps block summaries.
   A query attends (exact softmax) to the compressed blocks that end at or before its position
   (causal); one before the end of the first block sees none and gets zeros from this branch.
2. **Selection** (Eq. 8-12): keys are split into selection blocks of ``select_block`` (``l'``)
   keys (block ``j`` covers keys ``j*l' .. (j+1)*l' - 1``). A selection block's importance comes from the
   compression branch's softmax probabilities ``p_cmp`` (Eq. 8) by the paper's Eq. 9, a double sum::

       p_slc[j] = sum over m = 0 .. l'/d - 1, n = 0 .. l/d - 1 of  p_cmp[(l'/d) * j - m - n]

   Its ``[.]`` takes a vector's element counted from 1 while Eq. 7 and 12 count blocks from 0, so with
   blocks counted from 0 (as here) selection block ``j``'s terms are compression blocks
   ``(l'/d) * (j + 1) - 1 - m - n``. Split the keys into units of ``d``: compression block ``i``
   covers units ``i .. i + l/d - 1``, selection block ``j`` units ``(l'/d) j .. (l'/d)(j + 1) - 1``, and
   block ``i`` appears once for each unit the two share: Eq. 9 counts each compression block by its
   overlap with the selection block, in units of ``d`` keys. At the paper's ``l = 32, d = 16, l' = 64``
   the five blocks ``4j - 1 .. 4j + 3`` weigh 1, 2, 2, 2, 1 (16, 32, 32, 32, 16 keys shared); with ``l = d``
   each overlapping block counts once; where a block does not exist (before the first, past the last the
   query sees) its term is 0. :func:`selection_scores` computes the double sum as two box sums, ``n`` inside
   (the probability covering each unit), ``m`` outside (the units of each selection block). The paper
   states Eq. 9 for ``l <= l'``; the same double sum is the overlap for ``l > l'`` too, which this entry
   accepts [NSA-D7]. The importances are summed over the query heads of a GQA group (Eq. 10: one selection per
   K/V head, shared by its G query heads). Each query attends exactly to the keys (causal inside) of the
   ``select_blocks`` (``n``) best blocks, **including** the fixed initial block 0 and the 2 local blocks
   (its own block and the one before), as the paper's configuration does. The selection is not
   differentiated (a top-n).
3. **Sliding window**: the last ``window`` (``w``) keys up to the query, the query's own included
   (StreamingLLM's window, :mod:`topk_bench.attention.methods.sink_window`, without sinks). [NSA-D4] The paper writes
   the
   window as ``k[t-w : t]`` in the notation where ``k[i*d + 1 : i*d + l]`` is ``l`` keys, that is ``w + 1``
   keys; here ``w`` keys, the usual meaning of a window of ``w`` (one key in 512 at the paper's ``w``).

Deviations from the paper, each marked ``[NSA-Dn]`` here and listed with its reason in docs/sparse.md:
[NSA-D1] φ is mean pooling (above). [NSA-D2] One K/V for all three branches: the paper gives each branch its
own keys and values (§3.3.3, against shortcut learning between branches); the attention call receives one
``k, v``, so the three branches read it. [NSA-D3] The gates read the query, not the layer's input (below).
[NSA-D4] The window holds ``w`` keys (above). [NSA-D5] The bare function (no learned gate) weighs each branch
1/3 (below). [NSA-D6] A query that sees no whole compression block (causal, before position ``l - 1``) gets
zeros from that branch, the registry's rule for a row without keys (the paper leaves the case unsaid); its
selection has no score then, and takes its fixed blocks (the only ones it may take when ``l <= l'``).
[NSA-D7] Eq. 9 for ``l > l'`` (above). [NSA-D8] Torch ops, not the paper's kernel (below).

Gates: ``g = sigmoid(q @ gate_weight + gate_bias)`` per query head and position, ``gate_weight
[d, 3]`` (compression, selection, window). The paper computes them with an MLP from the layer's
input ``x``; the attention call sees only ``q, k, v``, so the gate reads the query, the per-token
feature this interface has [NSA-D3]. :class:`NSAAttention` (the registry's ``module_factory``) holds the gate
as learnable parameters, one per layer, initialised so that each gate starts at 1/3; the bare function
without them uses ``g = 1/3`` for each branch [NSA-D5]: the mean of three approximations of the same attention,
so that an untrained NSA approximates attention as the other selection methods do (``sigmoid(0) = 1/2``
each would weigh the branches 3/2 in all).

Defaults are the paper's (§4.1, "Pretraining setup"): ``l = 32, d = 16, l' = 64, n = 16`` (including
1 initial and 2 local blocks), ``w = 512``. ``d`` must divide ``l`` and ``l'``, as Eq. 9 requires (a
selection block of whole units of ``d`` keys).

Conventions of :mod:`topk_bench.attention.registry`: bottom-right causal alignment (query ``i`` at
``Lk - Lq + i``), a row with no allowed key gives zeros; grouped-query heads native (no repeated
K/V). Non-causal: compression and selection see every block; the window stays the ``w`` keys up
to the query's position (as :mod:`topk_bench.attention.methods.sink_window`).

Memory (linear in the length): the compression branch walks ``chunk_size`` query rows at a time
under activation checkpointing (its ``Lq x Lk/d`` probabilities are recomputed in backward, never
kept); the selection branch is :func:`topk_bench.attention.shared.block_attention.block_sparse_attention` over
a block table of ``Lq x n`` indices per K/V head (sampled products for training, copied blocks
for a decode step); the window keeps ``Lq x (w + 256)`` weights per head. Shape-static: runs
under ``FakeTensorMode``. The paper's Triton kernel (each GQA group's queries loaded with their shared
blocks) is not reproduced [NSA-D8]: the same torch ops run measured on the CPU and predicted.

Dtypes: half inputs compress, attend and gate in their dtype with float32 softmax statistics; the
selection's importance scores are float32 (a rounded score could change which block wins).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from topk_bench.attention.methods.sink_window import sink_window_attention
from topk_bench.attention.registry import Implementation, register, signature_options
from topk_bench.attention.shared.block_attention import block_sparse_attention
from topk_bench.attention.shared.masking import (
    check_activation,
    check_qkv,
    group_rows,
    query_positions,
    safe_softmax,
    stat_dtype,
    unfold_groups,
)
from topk_bench.attention.shared.selection import kept_state, n_blocks
from topk_bench.attention.shared.stages import ATTENTION, COMPRESSION, SELECTION, stage

# Blocks every query attends besides its top scores: the initial block and 2 local ones (own, previous).
FIXED_BLOCKS = 3
BRANCHES = ("compression", "selection", "window")


def n_compressed(lk: int, block: int, stride: int) -> int:
    """Compression blocks of ``lk`` keys: ``floor((Lk - l) / d) + 1`` whole blocks, 0 when ``Lk < l``."""
    return 0 if lk < block else (lk - block) // stride + 1


def compress(x: torch.Tensor, block: int, stride: int) -> torch.Tensor:
    """φ: the mean of each compression block, ``[B, H, nc, d]`` in ``x``'s dtype (float32 sums for half)."""
    b, h, lk, d = x.shape
    nc = n_compressed(lk, block, stride)
    if nc == 0:
        return x.new_zeros(b, h, 0, d)
    windows = x.unfold(2, block, stride)  # [B, H, nc, d, l], a view
    return (windows.sum(dim=-1, dtype=stat_dtype(x.dtype)) / block).to(x.dtype)


def selection_scores(probs: torch.Tensor, n_select: int, block: int, stride: int, select_block: int) -> torch.Tensor:
    """Eq. 9: the importance ``[..., n_select]`` of each selection block from the compression probabilities
    ``probs [..., nc]`` (0 for a block the query does not see), each block counted by its overlap with the
    selection block in units of ``stride`` keys (module doc).

    Two box sums, Eq. 9's double index: over ``n`` the probability covering each unit of ``stride`` keys
    (``sum_n p[u - n]``, ``block / stride`` blocks cover a unit), then over ``m`` the units of each selection block.
    """
    per_unit, per_select = block // stride, select_block // stride
    units = n_select * per_select  # n_select * select_block >= Lk, so every compression block ends in a unit
    padded = F.pad(probs, (per_unit - 1, max(0, units - probs.shape[-1])))
    covering = padded.unfold(-1, per_unit, 1).sum(dim=-1)[..., :units]
    return covering.unfold(-1, per_select, per_select).sum(dim=-1)


def _check(compress_block, compress_stride, select_block, select_blocks, window, chunk_size):
    if min(compress_block, compress_stride, select_block, chunk_size) < 1 or window < 0:
        raise ValueError(
            "nsa needs compress_block, compress_stride, select_block, chunk_size >= 1 and window >= 0, got "
            f"compress_block={compress_block}, compress_stride={compress_stride}, select_block={select_block}, "
            f"chunk_size={chunk_size}, window={window}"
        )
    if compress_block % compress_stride or select_block % compress_stride:
        raise ValueError(
            f"nsa needs compress_stride ({compress_stride}) to divide compress_block ({compress_block}) and "
            f"select_block ({select_block}): Eq. 9 counts compression blocks in units of compress_stride keys"
        )
    if select_blocks < FIXED_BLOCKS:
        raise ValueError(
            f"nsa needs select_blocks >= {FIXED_BLOCKS} (the initial and 2 local blocks are always selected), "
            f"got {select_blocks}"
        )


def _visible(pos: torch.Tensor, nc: int, block: int, stride: int, causal: bool) -> torch.Tensor | None:
    """Bool ``[C, nc]``: compression blocks that end at or before each query position (None: all, non-causal)."""
    if not causal:
        return None
    ends = torch.arange(nc, device=pos.device) * stride + (block - 1)
    return ends <= pos.unsqueeze(1)


def _compressed_probs(qg, kc, pos, groups, block, stride, causal):
    """Softmax ``[B, Hkv, G, C, nc]`` (float32 for half) of grouped query rows over the visible compressed keys."""
    scores = (qg @ kc.transpose(-2, -1)).to(stat_dtype(qg.dtype))
    b, hkv, rows, nc = scores.shape
    return safe_softmax(scores.view(b, hkv, groups, rows // groups, nc), _visible(pos, nc, block, stride, causal))


def _compressed_chunk(qg, kc, vc, pos, groups, block, stride, causal):
    """Compression branch output of one chunk of grouped query rows, ``[B, Hq, C, dv]``."""
    w = _compressed_probs(qg, kc, pos, groups, block, stride, causal)
    b, hkv = kc.shape[:2]
    out = w.to(vc.dtype).reshape(b, hkv, -1, kc.shape[2]) @ vc
    return unfold_groups(out, groups)


def compressed_attention(q, kc, vc, lk, causal, block, stride, chunk_size):
    """Branch 1: attention over the compressed keys, ``chunk_size`` query rows at a time.

    With gradients, each chunk is checkpointed: backward recomputes its probabilities (``B*Hq*C*nc``)
    instead of keeping ``Lq x nc`` of them, so memory stays linear in the length.
    """
    b, hq, lq, _ = q.shape
    hkv, nc, dv = kc.shape[1], kc.shape[2], vc.shape[-1]
    if nc == 0:
        return q.new_zeros(b, hq, lq, dv)
    groups = hq // hkv
    record = torch.is_grad_enabled() and (q.requires_grad or kc.requires_grad or vc.requires_grad)
    parts = []
    for r0 in range(0, lq, chunk_size):
        r1 = min(r0 + chunk_size, lq)
        pos = query_positions(r0, r1, lq, lk, q.device)
        args = (group_rows(q, groups, r0, r1), kc, vc, pos, groups, block, stride, causal)
        if record:
            parts.append(checkpoint(_compressed_chunk, *args, use_reentrant=False, preserve_rng_state=False))
        else:
            parts.append(_compressed_chunk(*args))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def selection_table(q, kc, lk, causal, block, stride, select_block, select_blocks, chunk_size):
    """Block table ``(blocks, ok)``, both ``[B, Hkv, Lq, n]`` with ``n = min(select_blocks, blocks of Lk)``.

    Shared by the G query heads of each K/V head. ``ok`` is False for a pick that is not eligible
    (causal: a block after the query's own; a query before the first key): fewer eligible blocks
    than ``n`` leave ``-inf`` picks.
    """
    b, hq, lq, _ = q.shape
    hkv, nc = kc.shape[1], kc.shape[2]
    groups = hq // hkv
    ns = n_blocks(lk, select_block)
    n = min(select_blocks, ns)
    blocks = torch.empty(b, hkv, lq, n, dtype=torch.long, device=q.device)
    ok = torch.empty(b, hkv, lq, n, dtype=torch.bool, device=q.device)
    ids = torch.arange(ns, device=q.device)
    sdt = stat_dtype(q.dtype)
    with torch.no_grad():
        qd, kd = q.detach(), kc.detach().to(sdt)
        for r0 in range(0, lq, chunk_size):
            r1 = min(r0 + chunk_size, lq)
            c = r1 - r0
            pos = query_positions(r0, r1, lq, lk, q.device)
            if nc:
                # Eq. 10: the group's query heads share one selection, their probabilities summed.
                probs = _compressed_probs(
                    group_rows(qd, groups, r0, r1).to(sdt), kd, pos, groups, block, stride, causal
                ).sum(dim=2)
                scores = selection_scores(probs, ns, block, stride, select_block)
                del probs  # freed before the masks below: the selection stage's peak is lower
            else:
                scores = torch.zeros(b, hkv, c, ns, dtype=sdt, device=q.device)
            own = torch.div(pos.clamp_min(0), select_block, rounding_mode="floor").unsqueeze(1)  # [C, 1]
            fixed = (ids == 0) | (ids == own) | (ids == own - 1)
            scores = scores.masked_fill(fixed, float("inf"))
            if causal:
                scores = scores.masked_fill((ids > own) | (pos < 0).unsqueeze(1), float("-inf"))
            top = scores.topk(n, dim=-1, sorted=False)
            blocks[:, :, r0:r1] = top.indices
            ok[:, :, r0:r1] = top.values > float("-inf")
    return blocks, ok


def _gates(q, gate_weight, gate_bias):
    """``[B, Hq, Lq, 3]`` sigmoid gates in ``q``'s dtype (float32 products for half), or None: 1/3 each."""
    if gate_weight is None and gate_bias is None:
        return None
    sdt = stat_dtype(q.dtype)
    logits = q.to(sdt) @ gate_weight.to(sdt) if gate_weight is not None else q.new_zeros(*q.shape[:-1], 3, dtype=sdt)
    if gate_bias is not None:
        logits = logits + gate_bias.to(sdt)
    return torch.sigmoid(logits).to(q.dtype)


def _compressed_kv(k, v, block, stride, compressed_k, compressed_v):
    """The compressed keys and values: built here from ``k, v`` (differentiated through them), or the ones
    kept with a decode cache (checked, not differentiated)."""
    if compressed_k is None and compressed_v is None:
        return compress(k, block, stride), compress(v, block, stride)
    b, hkv, lk, _ = k.shape
    nc = n_compressed(lk, block, stride)
    shapes = (
        ("compressed_k", compressed_k, k, "[B, Hkv, nc, d]"),
        ("compressed_v", compressed_v, v, "[B, Hkv, nc, dv]"),
    )
    return tuple(
        kept_state(
            kept,
            lambda x=x: compress(x, block, stride),
            name,
            layout,
            (b, hkv, nc, x.shape[-1]),
            f"compress({name[-1]}, {block}, {stride})",
        )
        for name, kept, x, layout in shapes
    )


def nsa_branches(
    q,
    k,
    v,
    *,
    causal=False,
    compress_block,
    compress_stride,
    select_block,
    select_blocks,
    window,
    chunk_size,
    compressed_k=None,
    compressed_v=None,
):
    """The three branch outputs ``(compression, selection, window)``, each ``[B, Hq, Lq, dv]``, before the gates."""
    check_qkv(q, k, v, batched=True)
    block, stride, select_block = int(compress_block), int(compress_stride), int(select_block)
    select_blocks, window, chunk_size = int(select_blocks), int(window), int(chunk_size)
    _check(block, stride, select_block, select_blocks, window, chunk_size)
    lk = k.shape[2]
    # Stages (topk_bench.attention.shared.stages): the forward's; a backward's own work is the autograd engine's,
    # except the
    # compression chunks' recomputation, which runs inside their checkpoint, unmarked.
    with stage(COMPRESSION):
        kc, vc = _compressed_kv(k, v, block, stride, compressed_k, compressed_v)
        o_cmp = compressed_attention(q, kc, vc, lk, causal, block, stride, chunk_size)
    with stage(SELECTION):
        blocks, ok = selection_table(q, kc, lk, causal, block, stride, select_block, select_blocks, chunk_size)
    o_slc = block_sparse_attention(q, k, v, blocks, ok, select_block, causal, chunk_size)  # marks its attention
    with stage(ATTENTION):
        o_win = sink_window_attention(q, k, v, causal=causal, sinks=0, window=window)
    return o_cmp, o_slc, o_win


def nsa_attention(
    q,
    k,
    v,
    *,
    causal=False,
    activation="softmax",
    # The paper's configuration (§4.1): compression block l = 32 with stride d = 16, selection block l' = 64,
    # n = 16 selected blocks (1 initial and 2 local among them), sliding window w = 512.
    compress_block=32,
    compress_stride=16,
    select_block=64,
    select_blocks=16,
    window=512,
    chunk_size=64,
    gate_weight=None,
    gate_bias=None,
    compressed_k=None,
    compressed_v=None,
):
    """NSA: gated sum of compressed-block, selected-block and sliding-window attention.

    ``gate_weight [d, 3]``, ``gate_bias [3]``: the gate (None: 1/3 per branch). ``compressed_k``,
    ``compressed_v``: ``compress(k / v, compress_block, compress_stride)`` kept with a decode cache
    (not differentiated); built here when None.
    """
    check_activation(activation, "nsa", ("softmax",))
    o_cmp, o_slc, o_win = nsa_branches(
        q,
        k,
        v,
        causal=causal,
        compress_block=compress_block,
        compress_stride=compress_stride,
        select_block=select_block,
        select_blocks=select_blocks,
        window=window,
        chunk_size=chunk_size,
        compressed_k=compressed_k,
        compressed_v=compressed_v,
    )
    g = _gates(q, gate_weight, gate_bias)
    if g is None:
        return (o_cmp + o_slc + o_win) / 3
    return g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win


def nsa_selection(
    q,
    k,
    *,
    causal=False,
    compress_block,
    compress_stride,
    select_block,
    select_blocks,
    window,
    chunk_size,
    compressed_k=None,
    **_ignored,
):
    """Bool ``[B, Hq, Lq, Lk]``: the keys NSA attends to one by one (selected blocks and the window; the
    compression branch reads block means, no key)."""
    check_qkv(q, k, k, batched=True)
    block, stride, select_block = int(compress_block), int(compress_stride), int(select_block)
    _check(block, stride, select_block, int(select_blocks), int(window), int(chunk_size))
    b, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    kc = compress(k.detach(), block, stride) if compressed_k is None else compressed_k.detach()
    blocks, ok = selection_table(q, kc, lk, causal, block, stride, select_block, int(select_blocks), int(chunk_size))
    picked = torch.zeros(b, hkv, lq, n_blocks(lk, select_block), dtype=torch.uint8, device=q.device)
    picked.scatter_reduce_(-1, blocks, ok.to(torch.uint8), "amax")
    keys = picked.bool().repeat_interleave(select_block, dim=-1)[..., :lk]
    keys = keys.repeat_interleave(hq // hkv, dim=1)
    cols = torch.arange(lk, device=q.device)
    pos = query_positions(0, lq, lq, lk, q.device).unsqueeze(1)
    keys = keys | ((cols <= pos) & (cols > pos - int(window)))
    return keys & (cols <= pos) if causal else keys


class NSAAttention(nn.Module):
    """NSA of one layer: its gate (``[d, 3]`` weights, 3 biases) is learned; the rest is the bare function's."""

    def __init__(self, head_dim: int, gate_weight=None, gate_bias=None, **options):
        super().__init__()
        self.options = options
        # Small initial weights (GPT-2's 0.02) and sigmoid(-log 2) = 1/3: every gate starts near the bare
        # function's 1/3.
        self.gate_weight = nn.Parameter(
            torch.randn(head_dim, 3) * 0.02 if gate_weight is None else torch.as_tensor(gate_weight).clone()
        )
        self.gate_bias = nn.Parameter(
            torch.full((3,), -math.log(2.0)) if gate_bias is None else torch.as_tensor(gate_bias).clone()
        )

    def forward(self, q, k, v, *, causal=False, activation="softmax"):
        return nsa_attention(
            q,
            k,
            v,
            causal=causal,
            activation=activation,
            gate_weight=self.gate_weight,
            gate_bias=self.gate_bias,
            **self.options,
        )


def nsa_cache_state(k, v, options) -> dict:
    """What a decode cache keeps for NSA (the registry's ``cache_state``): the compressed keys and values."""
    block, stride = int(options["compress_block"]), int(options["compress_stride"])
    return {"compressed_k": compress(k, block, stride), "compressed_v": compress(v, block, stride)}


# The options and their defaults: nsa_attention's.
OPTIONS = signature_options(nsa_attention)

NSA = register(
    Implementation(
        name="nsa",
        fn=nsa_attention,
        description="Native Sparse Attention: gated compressed-block, top-n selected-block and sliding-window branches",
        options=OPTIONS,
        label="NSA (l={compress_block}, d={compress_stride}, l'={select_block}, n={select_blocks}, w={window})",
        activations=("softmax",),
        exact=False,
        exact_when_covering=False,  # the gated compressed branch changes the attention whatever the budget
        gqa="native",
        machine_choices=("half_products",),
        selection=nsa_selection,
        # A token budget of selected keys: n blocks of l' (at least the 3 fixed ones); the window stays.
        budget=lambda tokens, options: {
            "select_blocks": max(FIXED_BLOCKS, int(tokens) // int(options["select_block"]))
        },
        cache_state=nsa_cache_state,
        stages=(COMPRESSION, SELECTION, ATTENTION),
        module_factory=NSAAttention,
    )
)
