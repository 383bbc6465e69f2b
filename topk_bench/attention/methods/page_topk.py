"""Page top-k attention over a KV cache: Quest ("Quest: Query-Aware Sparsity for Efficient
Long-Context LLM Inference", Tang et al., ICML 2024), written from its published description.

The cache is split into pages of ``page_size`` consecutive keys (the last page may
be partial); each page is summarised by the elementwise minimum and maximum of its
keys. For a query ``q`` the largest dot product any key of a page can reach is at most

    bound(page) = sum_d max(q_d * min_d, q_d * max_d) = q⁻ · min + q⁺ · max

(``q⁺ = max(q, 0)``, ``q⁻ = min(q, 0)``: one product with the summaries laid out
as ``[min | max]``). The query attends exactly (softmax over the chosen keys) to
the keys of the ``token_budget // page_size`` eligible pages with the highest
bounds, plus its current page (the page holding its own position). Eligible: any
other page; when causal, only pages before the current one (bottom-right aligned:
query ``i`` sits at ``Lk - Lq + i``, so decode's new tokens sit at the end of the
cache; the current page's keys after the query are masked).

Grouped-query heads: native, no K/V is repeated. By default (``group_pages=True``) the
G query heads of a K/V head share one selection: a page's bound for the group is the
largest of its heads' bounds (the bound of the union), and the group attends the pages
with the highest group bounds, so a step reads each chosen page once for all G heads
(the bytes a GQA cache saves stay saved: a 1/16 budget reads 1/16 of the cache).
``group_pages=False``: each query head ranks pages by its own bound with its kv head's
summaries (``h // (Hq // Hkv)``), as Quest for multi-head attention; the heads of a group
may then pick different pages, and a step reads up to G times as many. With ``Hq == Hkv``
the two are the same.

Dtypes: summaries and bounds are float32 for half inputs (a rounded bound could
change which page wins; the summaries are exact copies of key values either way);
on the batched CUDA path (:mod:`topk_bench.attention.shared.cuda_torch`) both are in the keys' dtype
instead (half the bytes a step reads), each bound summed in float32 by the GEMM and
rounded once (:func:`page_bounds` says when that can change the pages);
the scores of the selected keys come in the input dtype and their softmax is float32;
the output is in the input dtype. (A decode step on a CPU that emulates half GEMMs
computes those half products from float32 copies of the copied pages, rounded once:
:mod:`topk_bench.attention.shared.block_attention`.) Differentiable in q, k, v (exactly, the selection
held fixed); the summaries are not differentiated.

Summaries: :func:`page_summaries` builds them; pass them as ``summaries`` to keep
that work (and those bytes) outside a timed decode step, as a serving system keeps
them with the cache. Without it they are built on every call.
"""

from __future__ import annotations

import torch

from topk_bench.attention.kernels.triton import decode as triton_decode
from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared import cuda_torch
from topk_bench.attention.shared.block_attention import block_sparse_attention
from topk_bench.attention.shared.masking import check_activation, check_qkv, stat_dtype
from topk_bench.attention.shared.selection import kept_state, n_blocks, per_query_head, select_blocks, table_selection
from topk_bench.attention.shared.stages import ATTENTION, SELECTION

OPTIONS = {"page_size": 16, "token_budget": 1024, "group_pages": True, "summaries": None, "chunk_size": 64}


def page_summaries(k: torch.Tensor, page_size: int) -> torch.Tensor:
    """Per-page elementwise key minimum and maximum, ``[B, Hkv, P, 2, d]`` (index 0 = min, 1 = max).

    ``P = ceil(Lk / page_size)``; a partial last page is summarised over its own keys.
    Float32 for half keys (the bounds are float32; converting here, once per cache,
    keeps the conversion out of every decode step), else the key dtype; on the batched
    CUDA path (:mod:`topk_bench.attention.shared.cuda_torch`) always the key dtype. No rounding
    either way: each entry is one of the keys' values.
    """
    k = k.detach()
    b, h, lk, d = k.shape
    full = lk // page_size
    parts = []
    if full:
        pages = k[:, :, : full * page_size].reshape(b, h, full, page_size, d)
        parts.append(torch.stack((pages.amin(dim=3), pages.amax(dim=3)), dim=3))
    if lk % page_size:
        tail = k[:, :, full * page_size :]
        parts.append(torch.stack((tail.amin(dim=2), tail.amax(dim=2)), dim=2).unsqueeze(2))
    # min/max are exact in the key dtype: convert the summaries, not the cache.
    dtype = k.dtype if cuda_torch.batched(k) else stat_dtype(k.dtype)
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)).to(dtype)


def page_bounds(qg: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Upper bounds ``[B, Hkv, R, P]`` of ``q · k`` over each page, for grouped query rows ``qg [B, Hkv, R, d]``.

    In float32 for half queries and float32 summaries; summaries in the queries' half dtype (the batched CUDA
    path) give the bounds in that dtype: each product of a query and a summary entry is exact in float32 and the
    GEMM sums them in float32, then rounds the sum once. Rounding is monotonic, so it never reverses the order of
    two bounds; it can only make two bounds equal. The pages chosen from rounded bounds are then those chosen from
    float32 bounds unless the ``n``-th and ``(n+1)``-th largest float32 bounds of a row (``n`` pages chosen; for a
    shared group table, of the group's largest) round to the same value: closer than one unit in the last place
    of the half dtype at their size (bfloat16: 2⁻⁷ of the power of two below them), when the tie is broken by
    ``topk``'s order, not by the float32 values. A GEMM that reduces in reduced precision (cuBLAS may, for bf16,
    unless ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction`` is False) rounds partial sums
    too: a bound may then be off by more than its final rounding.
    """
    b, h, p, _, d = summaries.shape
    sdt = summaries.dtype if summaries.dtype == qg.dtype else stat_dtype(qg.dtype)
    qs = qg.to(sdt)
    # q⁻ pairs with the min, q⁺ with the max: sum_d max(q_d min_d, q_d max_d) in one product.
    signed = torch.cat((qs.clamp(max=0), qs.clamp(min=0)), dim=-1)  # [B, Hkv, R, 2d]
    # [P, 2d] @ [2d, R], not [R, 2d] @ [2d, P]: with few query rows (decode) the tall
    # product measured 2.5x faster on CPU; the transpose back is a view.
    return (summaries.reshape(b, h, p, 2 * d).to(sdt) @ signed.transpose(-2, -1)).transpose(-2, -1)


def _summaries(q, k, page_size, token_budget, summaries, chunk_size):
    """The options checked, and the summaries: built, or the caller's checked against the cache."""
    check_qkv(q, k, k, batched=True)
    if page_size < 1 or token_budget < 0 or chunk_size < 1:
        raise ValueError(
            f"page_topk needs page_size >= 1, token_budget >= 0, chunk_size >= 1, got "
            f"page_size={page_size}, token_budget={token_budget}, chunk_size={chunk_size}"
        )
    b, hkv, lk, d = k.shape
    return kept_state(
        summaries,
        lambda: page_summaries(k, page_size),
        "summaries",
        "[B, Hkv, P, 2, d]",
        (b, hkv, n_blocks(lk, page_size), 2, d),
        f"page_summaries(k, {page_size})",
    )


def _table(q, k, causal, page_size, token_budget, group_pages, summaries, chunk_size):
    summaries = _summaries(q, k, page_size, token_budget, summaries, chunk_size)
    hkv, lk = k.shape[1], k.shape[2]
    return select_blocks(
        q.detach(),
        hkv,
        lk,
        page_size,
        token_budget // page_size,
        causal,
        chunk_size,
        lambda qg: page_bounds(qg, summaries),
        shared=bool(group_pages),
    )


def page_topk_attention(
    q,
    k,
    v,
    *,
    causal=False,
    activation="softmax",
    page_size=16,
    token_budget=1024,
    group_pages=True,
    summaries=None,
    chunk_size=64,
):
    """Quest attention: each query attends its ``token_budget // page_size`` best-bounded pages plus its own.

    ``summaries``: optional ``page_summaries(k, page_size)``; built here when None.
    ``chunk_size``: query rows per step (bounds the ``B*Hq*C*budget`` temporaries).
    """
    check_activation(activation, "page_topk", ("softmax",))
    check_qkv(q, k, v, batched=True)
    page_size, token_budget, chunk_size = int(page_size), int(token_budget), int(chunk_size)
    kernels = triton_decode.page_topk_unsupported(
        q, k, v, causal=causal, page_size=page_size, group_pages=group_pages, chunk_size=chunk_size
    )
    if kernels is None:  # a decode step on CUDA: the Triton kernels
        summaries = _summaries(q, k, page_size, token_budget, summaries, chunk_size)
        return triton_decode.page_topk_decode(
            q, k, v, summaries, causal=causal, page_size=page_size, n_top=token_budget // page_size,
            group_pages=group_pages,
        )  # fmt: skip
    blocks, ok = _table(q, k, causal, page_size, token_budget, group_pages, summaries, chunk_size)
    # The batched CUDA path (:mod:`topk_bench.attention.shared.cuda_torch`): a decode step's pages copied in one part.
    gather_bytes = cuda_torch.GATHER_BYTES if cuda_torch.batched(q) else None
    return block_sparse_attention(q, k, v, blocks, ok, page_size, causal, chunk_size, gather_bytes)


def page_topk_selection(
    q, k, *, causal=False, page_size=16, token_budget=1024, group_pages=True, summaries=None, chunk_size=64, **_ignored
):
    """Bool ``[B, Hq, Lq, Lk]``: the keys :func:`page_topk_attention` attends to (True = attended)."""
    blocks, ok = _table(q, k, causal, int(page_size), int(token_budget), group_pages, summaries, int(chunk_size))
    hq = q.shape[1]
    return table_selection(per_query_head(blocks, hq), per_query_head(ok, hq), k.shape[2], int(page_size), causal)


PAGE_TOPK = register(
    Implementation(
        name="page_topk",
        machine_choices=("half_products", "triton_kernels", "cuda_torch"),
        fn=page_topk_attention,
        description="Quest page top-k: min/max key summaries per page bound q·k; exact attention on the best pages",
        options=OPTIONS,
        label="Page top-k (page={page_size}, budget={token_budget})",
        activations=("softmax",),
        exact=False,
        gqa="native",
        selection=page_topk_selection,
        budget=lambda tokens, options: {"token_budget": int(tokens)},
        stages=(SELECTION, ATTENTION),
        cache_state=lambda k, v, options: {"summaries": page_summaries(k, int(options["page_size"]))},
    )
)
