"""Test helpers: a deliberately naive dense attention (the reference) and float64 inputs."""

import torch


def reference_attention(q, k, v, *, causal=False, activation="softmax", topk=None, key_padding_mask=None):
    """``activation`` over the allowed scores of each row, optionally only its ``topk`` largest.

    Allowed: ``j <= Lk - Lq + i`` when causal (bottom-right alignment: query ``i`` sits at
    position ``Lk - Lq + i``), non-padding keys. A row with no allowed key gives 0.
    """
    scores = q @ k.transpose(-2, -1)
    lq, lk = scores.shape[-2:]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed, diagonal=lk - lq)  # bottom-right: key j for query i iff j <= Lk - Lq + i
    allowed = allowed.expand(scores.shape)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    if topk is not None and topk < lk:
        # The k-th largest allowed score of each row is the threshold.
        ranked = scores.masked_fill(~allowed, float("-inf")).sort(dim=-1, descending=True).values
        allowed = allowed & (scores >= ranked[..., topk - 1 : topk])
    if activation == "softmax":
        masked = scores.masked_fill(~allowed, float("-inf"))
        row_max = masked.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
        e = torch.exp(masked - row_max) * allowed
        denom = e.sum(dim=-1, keepdim=True)
        weights = e / torch.where(denom > 0, denom, torch.ones_like(denom))
    else:
        weights = torch.relu(scores) * allowed
    return weights @ v


TOL = dict(rtol=0, atol=1e-10)


def qkv(lq, lk, d=5, dv=4, b=2, h=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h, lk, dv, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, v


def out_and_grads(fn, q, k, v, **kw):
    out = fn(q, k, v, **kw)
    g = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    return (out, *torch.autograd.grad(out, (q, k, v), g))


def assert_all_close(got, want):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def qkv_gqa(lq, lk, hq, hkv, d=5, dv=4, b=2, seed=0, dtype=torch.float64):
    """Float64 ``q [b, hq, lq, d]``, ``k [b, hkv, lk, d]``, ``v [b, hkv, lk, dv]`` requiring grad."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, lq, d, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hkv, lk, d, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hkv, lk, dv, generator=g, dtype=dtype, requires_grad=True)
    return q, k, v


def with_repeated_kv(fn):
    """``fn`` on K/V repeated to the query heads (``repeat_interleave`` order: head h reads h // G).

    Gradients reach the un-repeated ``k, v`` through the repeat (summed over each group).
    """

    def repeated(q, k, v, **kw):
        groups = q.shape[-3] // k.shape[-3]
        return fn(q, k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3), **kw)

    return repeated


def reference_dsa(q, k, v, wq, wk, ww, *, topk, causal=False):
    """DeepSeek Sparse Attention, naively, one query at a time (DeepSeek-V3.2 report §2.1).

    For each batch, K/V head and query position ``t``: the group's query heads averaged and detached
    (the indexer's input), ``I(t, s) = sum_j w_j ReLU(qI_j · kI_s)`` for every allowed key ``s``
    (``qI = x wq`` split into ``H`` heads, ``w = x ww``, ``kI = k wk``), the ``topk`` keys of highest ``I``
    (all allowed keys when fewer), then each query head of the group: softmax of ``q · k`` over them, times V.
    Returns ``(out, indexer_loss)``: the loss is the mean over (batch, K/V head, position) of
    ``KL(p || softmax(I over the selected))``, ``p`` the group's attention probabilities summed, normalised.
    """
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    groups = hq // hkv
    heads = ww.shape[1]
    out_rows, losses = [], []
    for bi in range(b):
        for h in range(hkv):
            for t in range(lq):
                last = lk - lq + t if causal else lk - 1  # bottom-right: the last key query t may attend
                members = [h * groups + g for g in range(groups)]
                x = torch.stack([q[bi, m, t] for m in members]).detach().mean(dim=0)
                qi, w = (x @ wq).view(heads, -1), x @ ww
                candidates = list(range(0, last + 1))
                scores = {s: (w * torch.relu(qi @ (k[bi, h, s].detach() @ wk))).sum() for s in candidates}
                ranked = sorted(candidates, key=lambda s: float(scores[s].detach()), reverse=True)
                if len(ranked) > topk and float(scores[ranked[topk - 1]].detach()) == float(
                    scores[ranked[topk]].detach()
                ):
                    raise ValueError(f"a tie at the top-{topk} boundary (query {t}): the selection is ambiguous")
                chosen = ranked[:topk]
                rows = []
                probs = []
                for m in members:
                    if not chosen:
                        rows.append(torch.zeros(v.shape[-1], dtype=v.dtype))
                        continue
                    logits = torch.stack([q[bi, m, t] @ k[bi, h, s] for s in chosen])
                    p = torch.softmax(logits, dim=0)
                    probs.append(p.detach())
                    rows.append(sum(p[i] * v[bi, h, s] for i, s in enumerate(chosen)))
                out_rows.append(torch.stack(rows))
                if chosen:
                    target = torch.stack(probs).sum(dim=0)
                    target = target / target.sum()
                    index_logits = torch.stack([scores[s] for s in chosen])
                    log_p = torch.log_softmax(index_logits, dim=0)
                    losses.append((torch.xlogy(target, target) - target * log_p).sum())
                else:
                    losses.append(torch.zeros((), dtype=q.dtype))
    out = torch.stack(out_rows).view(b, hkv, lq, groups, -1).permute(0, 1, 3, 2, 4).reshape(b, hq, lq, -1)
    return out, torch.stack(losses).sum() / (b * hkv * lq)
