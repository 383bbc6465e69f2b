"""PyTorch's fused ``scaled_dot_product_attention``: what users pick today.

- Causal, bottom-right aligned: ``Lq == Lk`` is SDPA's own ``is_causal``; ``Lq == 1``
  sees every key (no mask); ``1 < Lq < Lk`` passes the ``Lq x Lk`` lower-right mask
  (``torch.nn.attention.bias.causal_lower_right`` would avoid it on CUDA but does not
  run under FakeTensorMode); ``Lq > Lk`` runs the last ``Lk`` rows as a square causal
  problem and gives the first ``Lq - Lk`` rows (no key) zeros, never NaN.
- Grouped-query heads (native): ``enable_gqa=True`` is not used: on the CPU (torch 2.13)
  it repeats K/V when ``Lq == Lk`` (its largest allocation is the repeated K) and is
  slow at decode shapes (577 ms per step at 131072 keys, Llama-3-8B heads, bf16, against
  58 ms for the folded call below). When the mask does not
  depend on the query row (non-causal, ``Lq == 1``) or is small (decode: a few rows),
  the G query heads of a group are folded into SDPA's row axis (``[*, Hkv, G*Lq, d]``,
  one call, the causal mask repeated per head of the group); otherwise (causal prefill)
  one call per group member, each on the K/V heads as they are.
- Half precision: SDPA's kernels (float32 accumulation and softmax statistics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.masking import allowed_keys, check_activation, fold_groups, kv_groups, unfold_groups


def _causal_mask(lq, lk, device, groups=1):
    """SDPA's boolean ``attn_mask`` (True = attend) for bottom-right causal rows, per group member."""
    allowed = allowed_keys(0, lq, lq, lk, causal=True, device=device)
    return allowed if groups == 1 else allowed.repeat(groups, 1)


def _fold_is_cheap(q, k, groups, causal):
    """Fold the groups into one call unless it needs a large mask: ``G*Lq x Lk`` bools, at most the size of K."""
    lq = q.shape[-2]
    if not causal or lq == 1:
        return True
    return groups * lq <= k[..., 0, :].numel() * k.element_size()


def sdpa_attention(q, k, v, *, causal=False, activation="softmax"):
    check_activation(activation, "sdpa", ("softmax",))
    groups = kv_groups(q, k, v)
    lq, lk = q.shape[-2], k.shape[-2]
    if causal and lq > lk:
        # The first lq - lk rows sit before every key (zero rows, zero gradients); the
        # last lk rows and the lk keys form a square causal problem.
        out = sdpa_attention(q[..., lq - lk :, :], k, v, causal=True)
        return F.pad(out, (0, 0, lq - lk, 0))
    # The caller has already scaled q (paper convention), hence scale=1.
    if groups == 1:
        if not causal or lq == lk or lq == 1:
            # lq == 1 (a new token after its cache) sees every key: no mask at all.
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal and lq == lk, scale=1.0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_mask(lq, lk, q.device), scale=1.0)
    if _fold_is_cheap(q, k, groups, causal):
        mask = _causal_mask(lq, lk, q.device, groups) if causal and lq > 1 else None
        out = F.scaled_dot_product_attention(fold_groups(q, groups), k, v, attn_mask=mask, scale=1.0)
        return unfold_groups(out, groups)
    # One call per member j of every group (query heads h*G + j), each with the K/V heads as they are.
    members = q.unflatten(-3, (-1, groups))
    outs = [sdpa_attention(members[..., j, :, :], k, v, causal=causal) for j in range(groups)]
    return torch.stack(outs, dim=-3).flatten(-4, -3)


SDPA = register(
    Implementation(
        name="sdpa",
        fn=sdpa_attention,
        description="torch.nn.functional.scaled_dot_product_attention (fused kernels)",
        label="PyTorch SDPA",
        activations=("softmax",),
        gqa="native",
    )
)
