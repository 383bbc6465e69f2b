"""Forward-only decode path of the top-k implementations: a few new query rows against a long KV cache.

Training-shaped top-k attention tiles the *queries* (``chunk_size`` rows, all keys) and
keeps what backward needs. A decode step has a handful of queries and no backward, so
``topk`` and ``topk_fast`` (without gradients, dropout, or more than
``min(DECODE_ROWS, chunk_size)`` query positions) instead:

1. compute every score of the step at once, ``[B*Hkv, G*Lq, Lk]``: the rows of a K/V
   head are the positions of its G query heads (row ``g*Lq + i`` is query head
   ``h*G + g`` at position ``i``), so one GEMM serves a whole group and K is read in
   place (grouped-query heads need no repeated K/V);
2. half inputs ranked in float32 (``float_scores``): by tiles of keys, each from one reused
   float32 copy of the tile, never of all of K (``DECODE_TILE_BYTES``: cache-sized on the
   CPU; ``DECODE_TILE_BYTES_CUDA`` on an accelerator, where one big GEMM is what the device wants, yet a float32 copy of
   a
   whole cache (512 MiB at 131072 Llama-3-8B tokens) is not); ranked in their own dtype: one
   product where the target multiplies half matrices natively, else the same float32 tiles,
   each product rounded once into the half scores (:mod:`topk_bench.attention.shared.hardware`); scores
   kept in that dtype;
3. mask (bottom-right causal, padding) once, on all scores; the caller selects its top-k
   (``topk``: plain, ``topk_fast``: pruned);
4. take the output as a weighted bag of the ``k`` selected V rows (``embedding_bag``),
   instead of a dense ``Lq x Lk`` product with all of V; or, on the batched CUDA path
   (:mod:`topk_bench.attention.shared.cuda_torch`), those rows copied by one ``index_select`` and weighed
   by one ``bmm`` (:func:`gathered_output`).

Everything is shape-static, so it runs under ``FakeTensorMode`` as well (there, with the same
allocations and FLOPs, in one product instead of one per tile). The tiles follow the target
device (:func:`topk_bench.attention.shared.hardware.device_kind`), so a CUDA case predicted on fake CPU
tensors under ``hardware.target("cuda")`` allocates the CUDA tiles.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from topk_bench.attention.shared.hardware import device_kind, native_half_matmul
from topk_bench.attention.shared.masking import allowed_keys, causal_offset, stat_dtype, upcast

# Query positions up to which a call without gradients takes this path (all scores of
# the step alive: ``Hq x Lq x Lk`` float32), besides the ``chunk_size`` option's bound.
DECODE_ROWS = 64
# CPU: bytes of the (float32) keys of one tile, all heads. Measured (topk_fast, bf16,
# 32/8 heads, d=128, 131072 keys, 1 thread, CPU time per step at Lq=1 / Lq=16): 2 MiB
# tiles (512 keys) 83 / 612 ms, 8 MiB 97 / 645 ms, 32 MiB 173 / 741 ms, all keys at
# once 418 / 955 ms: a converted tile must stay in cache for its GEMM. The price is
# two ops per tile (512 at 131072 keys), which costs on a machine whose cores are
# oversubscribed and a run with several threads (each parallel region can wait a
# scheduler slice): there no multi-op implementation keeps up with one fused kernel.
# CUDA: a tile of float32 keys large enough that each GEMM fills the device, bounded so that
# no step holds a float32 copy of a large cache (8 tiles at 131072 Llama-3-8B tokens).
DECODE_TILE_BYTES = 2 << 20
DECODE_TILE_BYTES_CUDA = 64 << 20


def use_decode_path(q, k, v, chunk_size: int, dropout: float) -> bool:
    """Whether a call takes the decode path: no gradient to record, no dropout, few query positions."""
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return not needs_grad and not dropout and q.shape[-2] <= min(DECODE_ROWS, chunk_size)


def decode_scores(q, k, groups: int, *, causal: bool, real_keys=None, multiple: int = 1, float_scores: bool = True):
    """Masked scores ``[B*Hkv, G*Lq, width]`` (float32 for half inputs); masked entries are ``-inf``.

    ``real_keys``: bool ``[B, Lk]``, True = a real key (:func:`~topk_bench.attention.shared.masking.from_padding`), or
    None.

    ``width``: ``Lk`` rounded up to a ``multiple`` (the extra columns are ``-inf``).
    ``float_scores=False``: half inputs' product in their own dtype (one product with every
    key, rounded as dense attention in that dtype rounds its scores), kept in that dtype:
    the selection reads half the bytes, and no float32 copy is made.
    """
    lq, d = q.shape[-2], q.shape[-1]
    lk = k.shape[-2]
    width = -(-lk // multiple) * multiple
    k3 = k.reshape(-1, lk, d)
    bkv = k3.shape[0]
    rows = groups * lq
    device = q.device
    qf = upcast(q.reshape(bkv, rows, d)) if float_scores else q.reshape(bkv, rows, d)
    scores = torch.empty(bkv, rows, width, dtype=qf.dtype, device=device)
    # Half inputs ranked in their dtype: one half product, unless the target emulates half GEMMs
    # and the keys span several float32 tiles: then float32 tiles, rounded into the half scores.
    half = qf.dtype != stat_dtype(qf.dtype)
    if half and (native_half_matmul(qf) or _tile_keys(qf, k3, torch.float32) >= lk):
        torch.matmul(qf, k3.transpose(1, 2), out=scores[:, :, :lk])
    else:
        _tiled_products(upcast(qf), k3, scores)
    if width > lk:
        scores[..., lk:].fill_(float("-inf"))
    grouped = scores.view(bkv, groups, lq, width)  # per-position masks broadcast over the G heads
    offset = causal_offset(lq, lk)
    lo = min(max(offset + 1, 0), lk)  # keys before lo are visible to every row
    if causal and lo < lk:
        allowed = allowed_keys(0, lq, lq, lk, causal=True, device=device, cols=(lo, lk))
        if allowed is not None:  # None: every key allowed
            grouped[..., lo:lk].masked_fill_(allowed.logical_not_(), float("-inf"))
    if real_keys is not None:  # [B, Lk] -> [B*Hkv, 1, 1, Lk]
        shape = (k.shape[0],) + (1,) * (k.dim() - 3) + (lk,)
        pad = real_keys.logical_not().view(shape).expand(*k.shape[:-2], lk).reshape(bkv, 1, 1, lk)
        grouped[..., :lk].masked_fill_(pad, float("-inf"))
    return scores


def _tile_keys(q, k3, dtype) -> int:
    """Keys per tile of :func:`_tiled_products` for keys ``k3`` multiplied in ``dtype``.

    CPU: cache-sized tiles (a converted tile stays in cache for its GEMM); an accelerator: all
    keys in one product, unless they are converted (a reused tile, never a copy of all of K).
    """
    bkv, lk, d = k3.shape
    if device_kind(q) == "cpu":
        tile_bytes = DECODE_TILE_BYTES
    elif k3.dtype != dtype:
        tile_bytes = DECODE_TILE_BYTES_CUDA
    else:
        return max(lk, 1)
    return min(max(lk, 1), max(1, tile_bytes // max(1, bkv * d * dtype.itemsize)))


def _tiled_products(qf, k3, scores):
    """``scores[:, :, :Lk] = qf @ k3ᵀ`` from float ``qf``; keys of another dtype converted a tile at a time.

    ``scores`` in ``qf``'s dtype gets the products; in a half dtype, each tile's float32
    products rounded once (as a half GEMM rounds them). Tiles of ``DECODE_TILE_BYTES`` on a CPU target,
    ``DECODE_TILE_BYTES_CUDA`` on an accelerator; keys in ``qf``'s dtype need no tiles (one product).
    """
    bkv, lk, d = k3.shape
    convert = qf.dtype != k3.dtype
    rounded = scores.dtype != qf.dtype
    tile = _tile_keys(qf, k3, qf.dtype)
    key_buffer = qf.new_empty(bkv, tile, d) if convert else None
    product = qf.new_empty(bkv, qf.shape[1], tile) if rounded else None
    if isinstance(qf, FakeTensor) and lk > tile and device_kind(qf) == "cpu":
        # Predicting for a CPU: every tile allocates and frees the same, so one tile's conversion and
        # one product over all keys (the converted tile broadcast; rounded scores: in their dtype)
        # have the loop's peak and FLOPs in a few ops, not Lk / tile pairs (16384 at 1M keys,
        # batch 8: minutes of fake ops). Not for CUDA: its GEMM would copy the broadcast operand
        # (the kernel rules see it), and its 64 MiB tiles are few (64 at 1M keys, batch 8).
        keys = key_buffer[:, :1].copy_(k3[:, :1]).expand(bkv, lk, d) if convert else k3
        if rounded:  # the products' FLOPs in the scores' dtype (no float32 buffer of all scores exists)
            keys, qf = k3[:, :1].expand(bkv, lk, d), k3[:, :1].expand(bkv, qf.shape[1], d)
        torch.matmul(qf, keys.transpose(1, 2), out=scores[:, :, :lk])
        return
    for t0 in range(0, lk, tile):
        t1 = min(t0 + tile, lk)
        keys = k3[:, t0:t1]
        if convert:
            keys = key_buffer[:, : t1 - t0].copy_(keys)
        if rounded:
            torch.matmul(qf, keys.transpose(1, 2), out=product[:, :, : t1 - t0])
            scores[:, :, t0:t1].copy_(product[:, :, : t1 - t0])
        else:
            torch.matmul(qf, keys.transpose(1, 2), out=scores[:, :, t0:t1])


def decode_output(weights, where, q, v):
    """``sum_t weights[.., t] * V[where[.., t]]`` per row, as ``[*, Hq, Lq, dv]``.

    ``weights, where [B*Hkv, G*Lq, k]``: the rows of :func:`decode_scores`, ``where`` the
    selected keys (``< Lk``) of the row's K/V head.
    """
    bkv, _, kk = where.shape
    lk, dv = v.shape[-2], v.shape[-1]
    where = where + (torch.arange(bkv, device=where.device) * lk).view(bkv, 1, 1)
    out = F.embedding_bag(
        where.view(-1, kk), v.reshape(-1, dv), per_sample_weights=weights.to(v.dtype).view(-1, kk), mode="sum"
    )
    return out.view(*q.shape[:-1], dv)


# Bytes of the V rows one part of :func:`gathered_output` copies: every row of a Llama-3-8B step (32 query heads,
# k = 8192 of 131072 keys, bf16: 64 MiB) in one part.
GATHERED_OUTPUT_BYTES = 64 << 20


def gathered_output(weights, where, q, v):
    """:func:`decode_output`'s result from copies: each row's ``k`` selected V rows copied by ``index_select``
    (a part of :data:`GATHERED_OUTPUT_BYTES` at a time, into one reused buffer), weighed by ``bmm``.

    The same sums as the bags (weights rounded to V's dtype, accumulated in float32 where the GEMM does), in few
    wide kernels: a GPU's ``embedding_bag`` runs one thread per bag and feature over the bag's ``k`` rows, one
    after another (32 bags x 128 features for a Llama-3-8B step), where the copy and the product spread over the
    whole device. It writes and reads the copied rows once more than the bags.
    """
    bkv, rows, kk = where.shape
    lk, dv = v.shape[-2], v.shape[-1]
    picked = (where + (torch.arange(bkv, device=where.device) * lk).view(bkv, 1, 1)).view(-1)
    values_of = v.reshape(-1, dv)
    w = weights.to(v.dtype).view(bkv * rows, 1, kk)
    total = bkv * rows
    step = min(total, max(1, GATHERED_OUTPUT_BYTES // max(1, kk * dv * v.element_size())))
    buffer = v.new_empty(step * kk, dv)
    out = v.new_empty(total, 1, dv)
    for r0 in range(0, total, step):
        r1 = min(r0 + step, total)
        gathered = torch.index_select(values_of, 0, picked[r0 * kk : r1 * kk], out=buffer[: (r1 - r0) * kk])
        torch.bmm(w[r0:r1], gathered.view(r1 - r0, kk, dv), out=out[r0:r1])
    return out.view(*q.shape[:-1], dv)
