"""Causal linear attention product with memory linear in the sequence length.

``out_i = sum_{j <= i} (a_i . b_j) v_j`` for feature maps ``a, b [.., L, m]`` and
values ``v [.., L, e]``: what fast-transformers' ``CausalDotProduct`` CUDA kernel
computes, here in plain PyTorch by chunks. Inside a chunk the ``C x C`` products
are masked; across chunks a running state ``sum_j b_jᵀ v_j`` (``m x e``) carries
the prefix. Only ``a, b, v`` are cached: backward redoes the prefix sums (a forward
scan for ``da``, a reverse scan for ``db`` and ``dv``). Memory: the inputs plus
``O(C^2 + m e)`` per head, never ``L x m x e``.

``a, b, v`` share their length (query ``i`` with key ``i``): callers align queries to
keys (Performer adds a cache prefix's state itself) and run grouped heads per group
member; it computes in the inputs' dtype (Performer passes float32).
"""

from __future__ import annotations

import torch

from implementations.masking import batched_addmm_t_


def _tril_products(x, y):
    """``tril(x yᵀ)``: the in-chunk pairs ``j <= i``."""
    return (x @ y.transpose(-2, -1)).tril_()


class CausalProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, v, chunk_size):
        length = a.shape[-2]
        out = v.new_empty(*a.shape[:-1], v.shape[-1])
        state = v.new_zeros(*a.shape[:-2], a.shape[-1], v.shape[-1])  # sum_j b_jᵀ v_j so far
        for s in range(0, length, chunk_size):
            e = min(s + chunk_size, length)
            ac, bc, vc = a[..., s:e, :], b[..., s:e, :], v[..., s:e, :]
            out_c = ac @ state
            out_c += _tril_products(ac, bc) @ vc
            out[..., s:e, :] = out_c
            batched_addmm_t_(state, bc, vc)
        ctx.save_for_backward(a, b, v)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, d_out):
        a, b, v = ctx.saved_tensors
        chunk_size = ctx.chunk_size
        length = a.shape[-2]
        starts = list(range(0, length, chunk_size))
        da = a.new_empty(a.shape)
        db = b.new_empty(b.shape)
        dv = v.new_empty(v.shape)
        # da_i = sum_{j <= i} (do_i . v_j) b_j: forward scan with state sum_j v_jᵀ b_j.
        state = v.new_zeros(*a.shape[:-2], v.shape[-1], b.shape[-1])
        for s in starts:
            e = min(s + chunk_size, length)
            bc, vc, doc = b[..., s:e, :], v[..., s:e, :], d_out[..., s:e, :]
            da_c = doc @ state
            da_c += _tril_products(doc, vc) @ bc
            da[..., s:e, :] = da_c
            batched_addmm_t_(state, vc, bc)
        # db_j = sum_{i >= j} (do_i . v_j) a_i and dv_j = sum_{i >= j} (a_i . b_j) do_i:
        # reverse scan with state sum_i a_iᵀ do_i over the later chunks.
        state = v.new_zeros(*a.shape[:-2], a.shape[-1], v.shape[-1])
        for s in reversed(starts):
            e = min(s + chunk_size, length)
            ac, bc, vc, doc = a[..., s:e, :], b[..., s:e, :], v[..., s:e, :], d_out[..., s:e, :]
            dv_c = bc @ state
            dv_c += _tril_products(ac, bc).transpose(-2, -1) @ doc
            dv[..., s:e, :] = dv_c
            db_c = vc @ state.transpose(-2, -1)
            db_c += _tril_products(doc, vc).transpose(-2, -1) @ ac
            db[..., s:e, :] = db_c
            batched_addmm_t_(state, ac, doc)
        return da, db, dv, None


def causal_product(a, b, v, chunk_size=128):
    """``out_i = sum_{j <= i} (a_i . b_j) v_j`` with memory linear in ``L`` (see module doc)."""
    return CausalProduct.apply(a, b, v, int(chunk_size))
