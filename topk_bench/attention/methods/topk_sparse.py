"""Top-k attention with the big sparse x dense products through ``torch.sparse`` (paper appendix).

Same algorithm and cache as ``topk`` (:class:`~topk_bench.attention.methods.topk.TopkFunction`);
only the products with the ``C x Lk`` matrices of top-k activations / gradients
(pseudo-code lines 8, 15, 21, 25) change: those matrices are never dense but a
``torch.sparse_coo_tensor`` with ``C * k`` entries, block-diagonal over the
``B * H`` heads so that one 2-D sparse product serves all heads. The sampled
product of line 15 gathers the ``k`` selected rows of V per query (``C x k x d``).

Causal alignment and grouped-query heads as ``topk`` (same function): with grouped
heads a chunk's matrix has ``G*C`` rows per K/V head (block-diagonal over ``B * Hkv``
heads), so its columns index K/V as they are. Half precision: computed in float32
(float32 copies of q, k, v; output and gradients in the input dtype), because
``torch.sparse.mm`` on the CPU accumulates half products in half precision (measured:
a row of 2048 equal bf16 weights gave outputs off by 70%); no decode path.
"""

from __future__ import annotations

import torch

from topk_bench.attention.methods.topk import TOPK_OPTIONS, make_topk
from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.selection import topk_budget, topk_selection


class SparseOps:
    """The products of :class:`~topk_bench.attention.methods.topk.TopkFunction` with sparse COO matrices."""

    half_in_float32 = True  # torch.sparse.mm accumulates half products in half precision

    @staticmethod
    def matrix(values, indices, n_keys, buffer=None):
        """``[.., C, k]`` values at column ``indices`` as a block-diagonal ``[BH*C, BH*Lk]`` COO matrix."""
        del buffer  # nothing dense to reuse
        *batch, rows, k = values.shape
        heads = values[..., 0, 0].numel()
        # Sorted columns within sorted rows: the entries are already coalesced (no sort by torch).
        indices, order = indices.sort(dim=-1)
        values = values.gather(-1, order)
        row = torch.arange(heads * rows, device=values.device).repeat_interleave(k)
        col = (indices.reshape(heads, rows * k) + n_keys * torch.arange(heads, device=values.device)[:, None]).reshape(
            -1
        )
        return torch.sparse_coo_tensor(
            torch.stack([row, col]),
            values.reshape(-1),
            (heads * rows, heads * n_keys),
            is_coalesced=True,
            check_invariants=False,
        )

    @staticmethod
    def mm(mat, x):
        """``mat @ x`` for ``x [.., Lk, d]``: returns ``[.., C, d]``."""
        batch, d = x.shape[:-2], x.shape[-1]
        return torch.sparse.mm(mat, x.reshape(-1, d)).view(*batch, -1, d)

    @staticmethod
    def addmm_t_(acc, mat, y):
        """``acc += matᵀ @ y`` in place (``acc`` contiguous ``[.., Lk, d]``)."""
        d = acc.shape[-1]
        acc.view(-1, d).addmm_(mat.t(), y.reshape(-1, d))

    @staticmethod
    def sampled_mm(a, b, indices):
        """``(a bᵀ)`` at ``indices`` only: dot products of each query with its ``k`` selected rows of ``b``."""
        *batch, rows, k = indices.shape
        d = b.shape[-1]
        b3 = b.reshape(-1, b.shape[-2], d)
        picked = b3.gather(1, indices.reshape(b3.shape[0], rows * k, 1).expand(-1, -1, d))  # [BH, C*k, d]
        out = picked.view(-1, k, d) @ a.reshape(-1, d, 1)  # [BH*C, k, 1]
        return out.view(*batch, rows, k)


topk_sparse_attention = make_topk(SparseOps)
topk_sparse_attention.__doc__ = "Top-k attention with torch.sparse products (paper appendix)."

TOPK_SPARSE = register(
    Implementation(
        name="topk_sparse",
        fn=topk_sparse_attention,
        description="top-k attention with the four big products through torch.sparse COO matrices (paper appendix)",
        options=TOPK_OPTIONS,
        label="Top-k sparse (size={chunk_size}, topk={topk})",
        exact=False,
        key_padding_mask=True,
        gqa="native",
        selection=topk_selection,
        budget=topk_budget,
    )
)
