"""Block top-k attention for prefill: MoBA ("MoBA: Mixture of Block Attention for Long-Context
LLMs", Lu et al., 2025), written from its published description.

The keys are split into blocks of ``block_size`` consecutive keys (the last block may
be partial), each represented by the mean of its keys. A query scores every block by
``q · mean`` (the gate), and attends exactly (one softmax over all its chosen keys)
to its own block (the block holding its position; causally masked inside) plus the
``topk_blocks`` highest-scoring earlier blocks. Non-causal: the other blocks on
either side compete. As in MoBA, the gate is not differentiated: gradients flow
through the attention over the chosen keys only.

Causal alignment: bottom-right (query ``i`` sits at ``Lk - Lq + i``); a query before
the first key (``Lq > Lk``) gets zeros. Grouped-query heads: native; a query head
gates with its kv head's block means (``h // (Hq // Hkv)``) and reads that head's
keys through indices, never a repeated copy.

Memory: the block table (``Lq x (topk_blocks + 1)`` indices per head) is all that is
kept besides q, k, v; forward and backward walk ``chunk_size`` query rows at a time,
with ``B*Hq*chunk_size*(topk_blocks + 1)*block_size`` score entries alive and no
``Lq x Lk`` tensor. Scores of the chosen keys come from the sampled product
(``embedding_bag``'s per-sample-weights gradient), outputs and ``dQ`` from
``embedding_bag``, ``dK``/``dV`` from bags of the entries sorted by key: no key or
value row is gathered. A decode step (no gradient, few query rows) instead copies its
chosen blocks whole, a few MiB at a time, for dense products
(:func:`topk_bench.attention.shared.block_attention.block_sparse_attention`). Shape-static: runs under
``FakeTensorMode``.

Dtypes: block means and gate scores are float32 for half inputs (a rounded gate
could change which block wins), the softmax and the K/V gradient accumulators too;
outputs and gradients come in the input dtype.

Block means: :func:`block_means` computes them from the keys on every call (prefill,
training); a decode step takes them kept with its cache (option ``means``, the
registry's ``cache_state``), as a serving system keeps them, instead of reading the
whole cache again to average it.
"""

from __future__ import annotations

import torch

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.block_attention import block_sparse_attention
from topk_bench.attention.shared.masking import check_activation, check_qkv, stat_dtype
from topk_bench.attention.shared.selection import kept_state, n_blocks, select_blocks, table_selection
from topk_bench.attention.shared.stages import ATTENTION, SELECTION

OPTIONS = {"block_size": 512, "topk_blocks": 3, "means": None, "chunk_size": 64}


def block_means(k: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mean key of each block, ``[B, Hkv, P, d]`` (float32 for half inputs); a partial last block over its keys."""
    b, h, lk, d = k.shape
    sdt = stat_dtype(k.dtype)
    full = lk // block_size
    parts = []
    if full:
        blocks = k[:, :, : full * block_size].reshape(b, h, full, block_size, d)
        parts.append(blocks.sum(dim=3, dtype=sdt) / block_size)
    if lk % block_size:
        parts.append((k[:, :, full * block_size :].sum(dim=2, dtype=sdt) / (lk % block_size)).unsqueeze(2))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def _table(q, k, causal, block_size, topk_blocks, means, chunk_size):
    check_qkv(q, k, k, batched=True)
    if block_size < 1 or topk_blocks < 0 or chunk_size < 1:
        raise ValueError(
            f"block_topk needs block_size >= 1, topk_blocks >= 0, chunk_size >= 1, got "
            f"block_size={block_size}, topk_blocks={topk_blocks}, chunk_size={chunk_size}"
        )
    b, hkv, lk, d = k.shape
    means = kept_state(
        means,
        lambda: block_means(k.detach(), block_size),
        "means",
        "[B, Hkv, P, d]",
        (b, hkv, n_blocks(lk, block_size), d),
        f"block_means(k, {block_size})",
    )
    means = means.transpose(-2, -1)  # [B, Hkv, d, P]
    return select_blocks(
        q.detach(),
        k.shape[1],
        k.shape[2],
        block_size,
        topk_blocks,
        causal,
        chunk_size,
        lambda qg: qg.to(means.dtype) @ means,
    )


def block_topk_attention(
    q, k, v, *, causal=False, activation="softmax", block_size=512, topk_blocks=3, means=None, chunk_size=64
):
    """MoBA attention: own block (causally) plus the ``topk_blocks`` earlier blocks whose mean key scores highest.

    ``means``: optional ``block_means(k, block_size)``; computed here when None.
    """
    check_activation(activation, "block_topk", ("softmax",))
    check_qkv(q, k, v, batched=True)
    block_size, topk_blocks, chunk_size = int(block_size), int(topk_blocks), int(chunk_size)
    blocks, ok = _table(q, k, causal, block_size, topk_blocks, means, chunk_size)
    return block_sparse_attention(q, k, v, blocks, ok, block_size, causal, chunk_size)


def block_topk_selection(q, k, *, causal=False, block_size=512, topk_blocks=3, means=None, chunk_size=64, **_ignored):
    """Bool ``[B, Hq, Lq, Lk]``: the keys :func:`block_topk_attention` attends to (True = attended)."""
    blocks, ok = _table(q, k, causal, int(block_size), int(topk_blocks), means, int(chunk_size))
    return table_selection(blocks, ok, k.shape[2], int(block_size), causal)


BLOCK_TOPK = register(
    Implementation(
        name="block_topk",
        machine_choices=("half_products",),
        fn=block_topk_attention,
        description="MoBA block top-k: own block plus the top-k blocks by q·mean key; exact attention on them",
        options=OPTIONS,
        label="Block top-k (block={block_size}, top-{topk_blocks})",
        activations=("softmax",),
        exact=False,
        gqa="native",
        selection=block_topk_selection,
        budget=lambda tokens, options: {"topk_blocks": int(tokens) // int(options["block_size"])},
        stages=(SELECTION, ATTENTION),
        cache_state=lambda k, v, options: {"means": block_means(k, int(options["block_size"]))},
    )
)
