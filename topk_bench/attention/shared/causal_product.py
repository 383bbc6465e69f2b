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


def _batched(x):
    """``[..., L, m]`` as ``[N, L, m]``: a view for what Performer passes (its contiguous feature
    maps, or one grouped-head member's slice of them)."""
    return x.reshape(-1, *x.shape[-2:])


def _chunks(chunk_size, *tensors):
    """Per chunk, the ``[N, C, .]`` views of each tensor.

    One ``split`` per tensor and ``bmm`` on 3-d views keep each chunk to a few
    dispatched ops, where slicing and 4-d ``matmul`` cost dozens: a prediction
    (FakeTensorMode) pays per op, and at 65K tokens there are hundreds of chunks.
    The tensors allocated, and when, are the same either way.
    """
    return list(zip(*(_batched(t).split(chunk_size, dim=1) for t in tensors)))


def _transposed_chunks(chunk_size, *tensors):
    """Per chunk, the ``[N, ., C]`` transposed views of each tensor (one transpose per tensor, not per chunk)."""
    return list(zip(*(_batched(t).transpose(1, 2).split(chunk_size, dim=2) for t in tensors)))


def _tril_products(x, y_t):
    """``tril(x yᵀ)`` from ``yᵀ``: the in-chunk pairs ``j <= i``."""
    return torch.bmm(x, y_t).tril_()


class CausalProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, v, chunk_size):
        out = v.new_empty(*a.shape[:-1], v.shape[-1])
        state = v.new_zeros(*a.shape[:-2], a.shape[-1], v.shape[-1])  # sum_j b_jᵀ v_j so far
        state3 = _batched(state)
        for (ac, vc, oc), (bc_t,) in zip(_chunks(chunk_size, a, v, out), _transposed_chunks(chunk_size, b)):
            out_c = torch.bmm(ac, state3)
            out_c += torch.bmm(_tril_products(ac, bc_t), vc)
            oc.copy_(out_c)
            state3.baddbmm_(bc_t, vc)  # in place: no temporary the size of the state
        ctx.save_for_backward(a, b, v)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, d_out):
        a, b, v = ctx.saved_tensors
        da = a.new_empty(a.shape)
        db = b.new_empty(b.shape)
        dv = v.new_empty(v.shape)
        chunks = list(
            zip(_chunks(ctx.chunk_size, a, b, v, d_out, da, db, dv), _transposed_chunks(ctx.chunk_size, a, b, v))
        )
        # da_i = sum_{j <= i} (do_i . v_j) b_j: forward scan with state sum_j v_jᵀ b_j.
        state = v.new_zeros(*a.shape[:-2], v.shape[-1], b.shape[-1])
        state3 = _batched(state)
        for (_, bc, _, doc, dac, _, _), (_, _, vc_t) in chunks:
            da_c = torch.bmm(doc, state3)
            da_c += torch.bmm(_tril_products(doc, vc_t), bc)
            dac.copy_(da_c)
            state3.baddbmm_(vc_t, bc)
        # db_j = sum_{i >= j} (do_i . v_j) a_i and dv_j = sum_{i >= j} (a_i . b_j) do_i:
        # reverse scan with state sum_i a_iᵀ do_i over the later chunks.
        state = v.new_zeros(*a.shape[:-2], a.shape[-1], v.shape[-1])
        state3 = _batched(state)
        state3_t = state3.transpose(1, 2)  # a view: it follows the in-place updates
        for (ac, bc, vc, doc, _, dbc, dvc), (ac_t, bc_t, vc_t) in reversed(chunks):
            dv_c = torch.bmm(bc, state3)
            dv_c += torch.bmm(_tril_products(ac, bc_t).transpose(1, 2), doc)
            dvc.copy_(dv_c)
            db_c = torch.bmm(vc, state3_t)
            db_c += torch.bmm(_tril_products(doc, vc_t).transpose(1, 2), ac)
            dbc.copy_(db_c)
            state3.baddbmm_(ac_t, doc)
        return da, db, dv, None


def causal_product(a, b, v, chunk_size=128):
    """``out_i = sum_{j <= i} (a_i . b_j) v_j`` with memory linear in ``L`` (see module doc)."""
    return CausalProduct.apply(a, b, v, int(chunk_size))
