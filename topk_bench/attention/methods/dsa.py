"""DeepSeek Sparse Attention (DSA), written from its published description: DeepSeek-AI,
"DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models" (2025), §2.1.

A *lightning indexer* scores every key ``s`` for query ``t``::

    I(t, s) = sum_j w[t, j] * ReLU(qI[t, j] · kI[s])        (j over ``index_heads`` indexer heads)

with the indexer's own projections: indexer queries ``qI [index_heads, index_head_dim]`` and per-head
weights ``w [index_heads]`` from the query token, one indexer key ``kI [index_head_dim]`` per key token.
Each query keeps the ``topk`` keys of highest ``I(t, ·)`` (masked keys excluded), and attends exactly
(softmax) to those keys only. The selection is shared by all heads that read the same keys: DSA runs
MLA in its MQA mode (one latent K/V shared by every query head), so here one selection per K/V head,
shared by its ``G = Hq // Hkv`` query heads (grouped-query attention, native: K/V are never repeated)
[DSA-D1].

Published defaults (the report's §2.1 and its continued pre-training, cited as there): 64 indexer heads,
indexer head dimension 128, ``k = 2048`` selected tokens -- this entry's option defaults. For BERT-base-sized
layers (12 heads of 64, 512 to 4K tokens) use :data:`BERT_BASE`: 4 indexer heads of dimension 32 and
``topk = 128`` (the paper's top-k default here), an indexer of about 1/4 of the attention's own projections'
width, as DeepSeek's 64 x 128 is about 1/2 of its 128 heads' query width while the model is 10x wider
[DSA-D7].

Inputs of the indexer. The registry's attention takes ``q, k, v``, not hidden states, so the indexer
reads them: its query input for a K/V head is the mean of that group's query heads (the head's own query
without grouping; DeepSeek's indexer reads the low-rank query latent shared by all heads, one vector per
token, as this mean is one per token and group), its key input is ``k`` [DSA-D2]. Both are detached, as DSA detaches
the indexer's input: the attention's gradients reach ``q, k, v`` through the attention over the selected
keys only, and the indexer learns from its own loss. The projections (``wq [d, H_I * D_I]``,
``wk [d, D_I]``, ``ww [d, H_I]``) are shared by all K/V heads; ``indexer`` passes them, else they are drawn
from ``seed`` (:func:`indexer_weights`, deterministic, so that a decode cache's indexer keys match the
step's weights; untrained unless the indexer loss trains them [DSA-D4]). :class:`DsaAttention` holds them as
parameters of a layer. The indexer is the report's formula alone: DeepSeek's released inference code also
normalises the indexer keys (LayerNorm), rotates part of the indexer queries and keys by their positions (RoPE),
applies a Hadamard rotation to both and scores them in FP8; none of these here [DSA-D3].

Memory. The indexer's logits are computed ``chunk_size`` query positions at a time (``B x Hkv x C x H_I x
Lk`` ReLU terms alive, then ``B x Hkv x C x Lk`` scores), as the paper computes its top-k; ``chunk_size`` =
the whole length materialises them all (what attention-gym's indexer does). Only the selection (``Lq x k``
indices per K/V head) is kept for backward besides q, k, v. The attention over the selected keys is
:func:`topk_bench.attention.shared.block_attention.block_sparse_attention` with blocks of one key (the sampled products
page top-k and block top-k use: per chunk ``B x Hq x C x k`` scores, no K/V row gathered, recomputed in
backward; a decode step copies its selected rows for dense products).

Indexer loss (``indexer_loss`` = its weight λ > 0, with gradients): DSA's sparse-stage KL loss,
``mean_t KL(p[t, S_t] || softmax(I[t, S_t]))`` with ``p`` the main attention's probabilities summed over the
group's heads and L1-normalised, over the selected set ``S_t`` (the report's dense warm-up stage, its loss over
every key with the main model frozen, is not here; it sums over all heads, the group's here [DSA-D5]). The
mean is over all ``B x Hkv x Lq`` rows, a row with no selected key (a query before the first key) adding 0,
where the report sums over the query tokens [DSA-D6]. Computed chunk by chunk in the forward, its
gradients with respect to the indexer's weights taken there at once (no chunk's activations are kept), and
handed to autograd with the output (the auxiliary-loss device: ``d(λ·L)/dW`` whatever ``d_out``), so that
``out.backward(...)`` trains the indexer too; :class:`DsaAttention` keeps the last loss (``indexer_loss_value``).
Its memory per chunk: the selected keys' indexer keys, their gradient and a temporary of the product's backward,
``3 x B x Hkv x C x k x D_I`` floats (the attention's own chunk holds ``B x Hq x C x k`` scores): lower
``chunk_size`` when the loss sets the peak (stage ``indexer_loss``).

Decoding: the same code without gradients; the indexer keys of the cache are computed once with it
(registry ``cache_state``: option ``index_keys``, ``[B, Hkv, Lk, D_I]``, float32 for half inputs) and kept beside
K and V, counted in ``kv_cache_bytes``.

Dtypes: the indexer in float32 for half inputs (its scores decide which keys win); the selected keys' scores in
the input dtype, their softmax float32, the output in the input dtype.

Stages (:mod:`topk_bench.attention.shared.stages`): ``indexer``, ``selection``, ``attention``, ``indexer_loss`` in the
forward;
``attention`` in the backward.

Deviations from the report, each marked ``[DSA-Dn]`` above, are listed with their reasons in docs/sparse.md.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from torch import nn

from topk_bench.attention.registry import Implementation, register, signature_options
from topk_bench.attention.shared.block_attention import block_sparse_attention, sampled_dots
from topk_bench.attention.shared.masking import allowed_keys, check_activation, check_qkv, stat_dtype, upcast
from topk_bench.attention.shared.stages import ATTENTION, INDEXER, INDEXER_LOSS, SELECTION, stage

# Reduced for BERT-base-sized layers (module doc).
BERT_BASE = MappingProxyType({"index_heads": 4, "index_head_dim": 32, "topk": 128})


def indexer_weights(
    head_dim: int, index_heads: int, index_head_dim: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(wq [d, H_I * D_I], wk [d, D_I], ww [d, H_I])`` drawn from ``seed`` on the CPU (the same on any device).

    Scaled so that ``qI · kI`` and ``I`` stay of order one: ``wq, wk`` by ``d^-1/2`` (unit-variance
    projections of unit-variance inputs) with the ``D_I^-1/2`` of a dot product folded into ``wq``, ``ww``
    by ``(d · H_I)^-1/2`` (DeepSeek scales its head weights by ``H_I^-1/2``).
    """
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    d, h, di = int(head_dim), int(index_heads), int(index_head_dim)

    def draw(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(dtype)

    return (
        draw(d, h * di, scale=(d * di) ** -0.5),
        draw(d, di, scale=d**-0.5),
        draw(d, h, scale=(d * h) ** -0.5),
    )


def index_keys(k: torch.Tensor, wk: torch.Tensor) -> torch.Tensor:
    """The indexer's keys ``[B, Hkv, Lk, D_I]`` (float32 for half ``k``): what a decode cache keeps beside K/V."""
    return upcast(k.detach()) @ wk.to(stat_dtype(k.dtype))


def _query_input(q: torch.Tensor, groups: int) -> torch.Tensor:
    """The indexer's query input ``[B, Hkv, Lq, d]``: the mean of each group's query heads, detached."""
    b, hq, lq, d = q.shape
    return upcast(q.detach()).view(b, hq // groups, groups, lq, d).mean(dim=2)


def _index_scores(xq, ki, wq, ww, index_heads):
    """``I(t, s)`` ``[B, Hkv, C, Lk]`` for the chunk's query inputs ``xq [B, Hkv, C, d]``."""
    b, h, c, _ = xq.shape
    qi = (xq @ wq).view(b, h, c * index_heads, -1)  # [B, Hkv, C*H_I, D_I]
    terms = torch.relu_(qi @ ki.transpose(-2, -1)).view(b, h, c, index_heads, -1)  # [B, Hkv, C, H_I, Lk]
    weights = (xq @ ww).unsqueeze(-2)  # [B, Hkv, C, 1, H_I]
    return (weights @ terms).squeeze(-2)  # sum_j w_j ReLU(qI_j · kI)


def _select(xq, ki, wq, ww, index_heads, kk, s, e, lq, lk, causal):
    """The chunk's selection: indices ``[B, Hkv, C, kk]`` and whether each is an allowed key."""
    with stage(INDEXER):
        scores = _index_scores(xq, ki, wq, ww, index_heads)
        allowed = allowed_keys(s, e, lq, lk, causal=causal, device=xq.device)
        if allowed is not None:
            scores.masked_fill_(allowed.logical_not_(), float("-inf"))
        del allowed
    with stage(SELECTION):
        top, idx = scores.topk(kk, dim=-1, sorted=False)
        ok = top > float("-inf")
    return idx, ok


def _target(q, k, idx, ok, groups, s, e):
    """DSA's target for the indexer: the main attention's probabilities over the selected keys ``[B, Hkv, C, kk]``,
    summed over the group's query heads and L1-normalised (float32 for half inputs; zeros for a row without keys).

    The selected keys' scores come from the sampled product (block_attention's: no key row gathered).
    """
    b, hq, _, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    c, kk = e - s, idx.shape[-1]
    base = (torch.arange(b * hkv, device=idx.device) * lk).view(b, hkv, 1, 1, 1)
    rows = (idx.unsqueeze(2) + base).expand(b, hkv, groups, c, kk).reshape(b * hq * c, kk)
    scores = upcast(sampled_dots(q[:, :, s:e].reshape(-1, d), k.reshape(-1, d), rows)).view(b, hkv, groups, c, kk)
    scores = scores.masked_fill_(ok.logical_not().unsqueeze(2), float("-inf"))
    top = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)  # no allowed key: no NaN
    p = torch.exp_(scores.sub_(top))
    p = p.div_(p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)).sum(dim=2)
    return p.div_(p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny))


class _WithIndexerGrads(torch.autograd.Function):
    """Returns ``out``; its backward also hands the indexer's weights their loss gradients, computed beforehand."""

    @staticmethod
    def forward(ctx, out, wq, wk, ww, gq, gk, gw):
        ctx.grads = (gq, gk, gw)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, d_out):
        gq, gk, gw = ctx.grads
        return d_out, gq, gk, gw, None, None, None


def _loss_grads(xq, ki, weights, idx, ok, target, index_heads, grads):
    """The chunk's indexer KL loss (summed over its rows); adds its gradients w.r.t. ``(wq, ww, ki)`` to ``grads``.

    Only the selected keys' indexer keys are gathered (``D_I`` wide, not ``d``); ``wk``'s gradient follows from
    ``ki``'s once every chunk is done (``ki = k wk``).
    """
    wq, ww = (w.detach().requires_grad_() for w in weights)
    ki = ki.detach().requires_grad_()
    with torch.enable_grad():
        # index_select, not gather: its backward adds rows into d ki without an index as wide as the rows.
        b, h, c, kk = idx.shape
        lk, di = ki.shape[-2], ki.shape[-1]
        base = (torch.arange(b * h, device=idx.device) * lk).view(b, h, 1, 1)
        ki_sel = ki.reshape(-1, di).index_select(0, (idx + base).view(-1)).view(b, h, c, kk, di)
        qi = (xq @ wq).view(b, h, c, index_heads, -1)  # [B, Hkv, C, H_I, D_I]
        terms = torch.relu(qi @ ki_sel.transpose(-2, -1))  # [B, Hkv, C, H_I, kk]
        logits = ((xq @ ww).unsqueeze(-2) @ terms).squeeze(-2)  # [B, Hkv, C, kk]
        logits = logits.masked_fill(ok.logical_not(), torch.finfo(logits.dtype).min)
        kl = torch.xlogy(target, target) - target * torch.log_softmax(logits, dim=-1)
        loss = kl.masked_fill(ok.logical_not(), 0.0).sum()
    for acc, g in zip(grads, torch.autograd.grad(loss, (wq, ww, ki))):
        acc.add_(g)
    return loss.detach()


def _check(q, k, topk, index_heads, index_head_dim, chunk_size, indexer_loss):
    if min(int(topk), int(index_heads), int(index_head_dim), int(chunk_size)) < 1 or indexer_loss < 0:
        raise ValueError(
            "dsa needs topk, index_heads, index_head_dim, chunk_size >= 1 and indexer_loss >= 0, got "
            f"topk={topk}, index_heads={index_heads}, index_head_dim={index_head_dim}, chunk_size={chunk_size}, "
            f"indexer_loss={indexer_loss}"
        )


def _weights(q, indexer, index_heads, index_head_dim, seed):
    d = q.shape[-1]
    if indexer is None:
        return tuple(w.to(q.device, stat_dtype(q.dtype)) for w in indexer_weights(d, index_heads, index_head_dim, seed))
    shapes = ((d, index_heads * index_head_dim), (d, index_head_dim), (d, index_heads))
    if len(indexer) != 3 or any(tuple(w.shape) != s for w, s in zip(indexer, shapes)):
        got = [tuple(w.shape) for w in indexer]
        raise ValueError(f"indexer must be (wq, wk, ww) of shapes {list(shapes)}, got {got}")
    return tuple(indexer)


def dsa_attention(
    q,
    k,
    v,
    *,
    causal=False,
    activation="softmax",
    # DeepSeek-V3.2's (report §2.1): 64 indexer heads of dimension 128, 2048 selected tokens.
    index_heads=64,
    index_head_dim=128,
    topk=2048,
    chunk_size=64,
    indexer_loss=0.0,
    seed=0,
    indexer=None,
    index_keys=None,
    loss_out=None,
):
    """DSA: each query attends its ``topk`` keys of highest lightning-indexer score, shared by its K/V group.

    ``indexer``: ``(wq, wk, ww)`` (:func:`indexer_weights`' shapes), else drawn from ``seed``.
    ``index_keys``: the cache's indexer keys (:func:`index_keys`), else computed here.
    ``loss_out``: a list that receives the indexer loss (a 0-dim tensor) when it is computed.
    """
    check_activation(activation, "dsa", ("softmax",))
    groups = check_qkv(q, k, v, batched=True)
    _check(q, k, topk, index_heads, index_head_dim, chunk_size, indexer_loss)
    b, hkv, lk, _ = k.shape
    lq = q.shape[-2]
    index_heads, chunk_size = int(index_heads), int(chunk_size)
    kk = min(int(topk), lk)
    weights = _weights(q, indexer, int(index_heads), int(index_head_dim), seed)
    sdt = stat_dtype(q.dtype)
    wq, wk, ww = (w.detach().to(sdt) for w in weights)
    with stage(INDEXER):
        xq = _query_input(q, groups)
        if index_keys is None:
            ki = upcast(k.detach()) @ wk
        elif tuple(index_keys.shape) != (b, hkv, lk, int(index_head_dim)):
            raise ValueError(
                f"index_keys must be [B, Hkv, Lk, D_I] = {(b, hkv, lk, int(index_head_dim))} "
                f"(dsa.index_keys(k, wk)), got {tuple(index_keys.shape)}"
            )
        else:
            ki = index_keys.detach().to(sdt)
    idx = torch.empty(b, hkv, lq, kk, dtype=torch.long, device=q.device)
    ok = torch.empty(b, hkv, lq, kk, dtype=torch.bool, device=q.device)
    for s in range(0, lq, chunk_size):
        e = min(s + chunk_size, lq)
        idx[:, :, s:e], ok[:, :, s:e] = _select(xq[:, :, s:e], ki, wq, ww, index_heads, kk, s, e, lq, lk, causal)
    # Each selected key is a block of one: the sampled products of block_attention (no K/V row gathered in
    # training; a decode step copies its selected rows for dense products).
    out = block_sparse_attention(q, k, v, idx, ok, 1, causal, chunk_size)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not training or not (indexer_loss > 0):
        return out
    total, grads = _indexer_loss(q, k, xq, ki, (wq, ww), idx, ok, groups, index_heads, chunk_size)
    rows = b * hkv * lq
    if loss_out is not None:
        loss_out.append(total / rows)
    if not any(isinstance(w, torch.Tensor) and w.requires_grad for w in weights):  # no indexer to train
        return out
    scale = float(indexer_loss) / rows
    gq, gk, gw = ((g * scale).to(w.dtype) for g, w in zip(grads, weights))
    return _WithIndexerGrads.apply(out, *weights, gq, gk, gw)


def _indexer_loss(q, k, xq, ki, weights, idx, ok, groups, index_heads, chunk_size):
    """The indexer's loss, DSA's KL towards the main attention's distribution over the selected keys, summed over
    the rows, and its gradients ``(d wq, d wk, d ww)`` (float32 for half inputs)."""
    wq, ww = weights
    lq = q.shape[-2]
    grads = [torch.zeros_like(wq), torch.zeros_like(ww), torch.zeros_like(ki)]  # d wq, d ww, d ki
    total = q.new_zeros((), dtype=wq.dtype)
    with torch.no_grad(), stage(INDEXER_LOSS):
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            ci, cok = idx[:, :, s:e], ok[:, :, s:e]
            target = _target(q.detach(), k.detach(), ci, cok, groups, s, e)
            total += _loss_grads(xq[:, :, s:e], ki, (wq, ww), ci, cok, target, index_heads, grads)
        d_ki = grads.pop()
        grads.insert(1, upcast(k.detach()).reshape(-1, k.shape[-1]).transpose(0, 1) @ d_ki.reshape(-1, d_ki.shape[-1]))
    return total, grads


class DsaAttention(nn.Module):
    """DSA of one layer: the lightning indexer's weights, parameters trained by ``indexer_loss`` (else buffers)."""

    wq: torch.Tensor
    wk: torch.Tensor
    ww: torch.Tensor

    def __init__(self, head_dim: int, **options):
        super().__init__()
        self.options = {k: v for k, v in options.items() if k != "indexer"}
        weights = indexer_weights(head_dim, options["index_heads"], options["index_head_dim"], options["seed"])
        # Only the indexer loss trains the indexer (its input is detached, its top-k has no gradient): without
        # it the weights are buffers, so that no parameter of the layer is left without a gradient.
        for name, w in zip(("wq", "wk", "ww"), weights):
            if options.get("indexer_loss", 0.0) > 0:
                self.register_parameter(name, nn.Parameter(w))
            else:
                self.register_buffer(name, w)
        self.indexer_loss_value: torch.Tensor | None = None

    def forward(self, q, k, v, *, causal=False, activation="softmax"):
        losses: list[torch.Tensor] = []
        out = dsa_attention(
            q,
            k,
            v,
            causal=causal,
            activation=activation,
            indexer=(self.wq, self.wk, self.ww),
            loss_out=losses,
            **self.options,
        )
        self.indexer_loss_value = losses[0] if losses else None
        return out


def dsa_selection(
    q,
    k,
    *,
    causal=False,
    index_heads,
    index_head_dim,
    topk,
    chunk_size,
    seed,
    indexer=None,
    index_keys=None,
    **_ignored,
):
    """Bool ``[B, Hq, Lq, Lk]``: the keys :func:`dsa_attention` attends to (True = attended), with its options (the
    registry's defaults: :data:`OPTIONS`)."""
    groups = check_qkv(q, k, k, batched=True)
    b, hkv, lk, _ = k.shape
    lq = q.shape[-2]
    kk = min(int(topk), lk)
    wq, wk, ww = (
        w.detach().to(stat_dtype(q.dtype)) for w in _weights(q, indexer, int(index_heads), int(index_head_dim), seed)
    )
    xq = _query_input(q, groups)
    ki = upcast(k.detach()) @ wk if index_keys is None else index_keys.to(wk.dtype)
    chosen = torch.zeros(b, hkv, lq, lk, dtype=torch.bool, device=q.device)
    for s in range(0, lq, int(chunk_size)):
        e = min(s + int(chunk_size), lq)
        idx, ok = _select(xq[:, :, s:e], ki, wq, ww, int(index_heads), kk, s, e, lq, lk, causal)
        chosen[:, :, s:e].scatter_(-1, idx, ok)
    return chosen.repeat_interleave(groups, dim=1)


def _cache_state(k, v, options):
    """The cache's indexer keys, built once with the cache (decode)."""
    _, wk, _ = indexer_weights(k.shape[-1], options["index_heads"], options["index_head_dim"], options["seed"])
    # Rounded as a layer cast to k's dtype rounds its parameter, so that the step's indexer and its cache agree.
    return {"index_keys": index_keys(k, wk.to(k.device, k.dtype))}


# The options and their defaults: dsa_attention's (its loss_out is a direct call's hook, not an option).
OPTIONS = signature_options(dsa_attention, exclude=("loss_out",))

DSA = register(
    Implementation(
        name="dsa",
        fn=dsa_attention,
        description="DeepSeek Sparse Attention: lightning indexer (ReLU heads, weighted), top-k keys per K/V group, "
        "exact attention on them; indexer in query chunks; optional KL indexer loss",
        options=OPTIONS,
        label="DSA (indexer {index_heads}x{index_head_dim}, topk={topk})",
        activations=("softmax",),
        exact=False,
        topk_of_scores=False,  # its topk ranks keys by the indexer, not by the attention's scores
        gqa="native",
        selection=dsa_selection,
        budget=lambda tokens, options: {"topk": int(tokens)},
        cache_state=_cache_state,
        machine_choices=("half_products",),
        module_factory=DsaAttention,
        stages=(INDEXER, SELECTION, ATTENTION, INDEXER_LOSS),
    )
)
