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
