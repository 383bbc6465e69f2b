"""``topk_fast``'s training path on CUDA as Triton kernels (:mod:`.kernels`), exposed as torch ops.

Three launches per layer call instead of ~1,900 torch ops: the exact row top-k of each block of query rows, the
score tiles kept on chip (``topk_select_``); attention over each row's ``k`` selected keys, fp32 (``gathered_forward_``,
which saves ``log Σ exp`` per row); and its backward (``gathered_backward_``: dQ per row, dK/dV added atomically into
float32 accumulators). Saved for backward: Q, K, V, the output, int32 indices and one float32 per row (no ``Lq x k``
scores).

- Results: those of ``topk_fast``'s CPU path (the same keys, ranked the same way: the input dtype's rounded product,
  or float32 with ``float_scores``) up to fp32 summation order; on ties at the k-th score the lowest key index wins
  (the CPU path keeps the ties its scan meets first: either is a valid top-k, tests avoid such ties or check the
  rule itself).
- The ops write into tensors the caller allocated; their fake kernels allocate nothing, so ``FakeTensorMode`` (the
  predict backend, ``--device cuda``) sees every byte a real run allocates.
- CPU tensors run the same kernels in Triton's interpreter (how the tests hold them to the float64 oracle).
- Taken where :mod:`.defaults` chooses them: ``TOPK_BENCH_TRITON=1``; unset, its table keeps ``topk_fast``'s
  training on the torch path (faster on an H200).
- Not here (:func:`unsupported` says why, the caller keeps its torch path): decode steps, dropout, key padding,
  float64, ``topk > MAX_TOPK``, head sizes over ``MAX_TRAINING_HEAD_DIM`` and a machine without an importable
  ``triton``.

Importable without triton (:func:`status` then says why not).
"""

from __future__ import annotations

import torch

from topk_bench.attention.kernels.triton import defaults
from topk_bench.attention.kernels.triton.launch import (
    KERNEL_DTYPES,
    cdiv,
    launch_kernel,
    leading_strides,
    pow2_at_least,
    why_not_taken,
    why_not_taken_warned,
)
from topk_bench.attention.shared.hardware import device_kind
from topk_bench.attention.shared.masking import causal_offset

# Largest k the selection takes: its picks, K_PAD = 256 int64 keys a query row, are sorted once in registers at the
# end (.ci/compile_triton_kernels.py: no spill on sm_80 and sm_90, 254 registers on sm_80; docs/triton.md).
MAX_TOPK = 256
# Largest head size of the training kernels compiled and checked. The selection's score product walks the head
# BLOCK_D at a time: its K slice does not grow with the head size, its registers little (216-254 at d = 64, 227-254
# at d = 128).
MAX_TRAINING_HEAD_DIM = 128
# Head-dim slice of the selection's score product (tl.dot's minimum depth): a BLOCK_D x K_PAD slice of K live at a
# time. The whole K tile at once (the FMA product of float32 holds its operands in every thread) spilled at d = 128.
BLOCK_D = 16
# Query rows per selection tile (tl.dot's minimum tile side).
BLOCK_M = 16
# Keys per block of the selection's walk: one BLOCK_M x BLOCK_N score tile, one compare a score against the rows'
# thresholds; a row's candidate buffer holds CAP = K_PAD + BLOCK_N rounded up to a power of two (room for a block
# after every cut to k).
BLOCK_N = 64
# Most selection programs launched: each walks tiles of BLOCK_M rows in turn, with one candidate buffer
# ([BLOCK_M, CAP] int64: 32 KiB at k = 128, 64 KiB at 256) of a scratch tensor the caller allocates: 16 MiB (32 MiB)
# at most, whatever the length (about 4 waves of an H100's 132 SMs).
SELECT_PROGRAMS = 512
# The switch (``TOPK_BENCH_TRITON``): 1 forces the kernels wherever they take the call, 0 disables them, unset
# leaves it to the table of measured defaults (:mod:`.defaults`).
SWITCH_ENV = defaults.SWITCH_ENV


def status(impl: str) -> str:
    """``triton:<version>`` when the kernels take ``impl``'s CUDA calls (where they support them), else
    ``torch:<why not>`` (for provenance: the row's ``code_path``)."""
    why = why_not_taken(impl)
    if why is not None:
        return f"torch:{why}"
    import triton

    return f"triton:{triton.__version__}"


def unsupported(q, k, v, *, topk: int, dropout: float, key_padding_mask) -> str | None:
    """Why the Triton path does not take this training call (None: it does). Only CUDA inputs are candidates; a
    missing triton, where the kernels were chosen, is said once per process (a warning), the rest silently (asked
    for, or documented limits)."""
    if device_kind(q) != "cuda":
        return "not a CUDA tensor"
    why = why_not_taken_warned("topk_fast", defaults.TRAINING, "the torch path", stacklevel=3)
    if why is not None:
        return why
    if dropout:
        return "dropout"
    if key_padding_mask is not None:
        return "key padding"
    if q.dtype not in KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}"
    if min(topk, k.shape[-2]) > MAX_TOPK:
        return f"topk > {MAX_TOPK}"
    if max(q.shape[-1], v.shape[-1]) > MAX_TRAINING_HEAD_DIM:
        return f"head size > {MAX_TRAINING_HEAD_DIM}"
    return None


def select_config(kk: int, d: int) -> dict:
    """Constexprs and launch options of ``topk_select_kernel`` for top-``kk`` of head size ``d``."""
    k_pad = pow2_at_least(kk)
    cap = pow2_at_least(k_pad + BLOCK_N)
    return dict(D=d, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, K_PAD=k_pad, CAP=cap, num_warps=8)


def select_grid(heads: int, lq: int) -> tuple[int]:
    """The selection's programs for ``heads`` rows of ``lq`` queries: one a tile of ``BLOCK_M`` query rows, at most
    :data:`SELECT_PROGRAMS` (each walks tiles in turn, with a candidate buffer of its own)."""
    return (min(cdiv(lq, BLOCK_M) * heads, SELECT_PROGRAMS),)


def candidate_buffers(q: torch.Tensor, kk: int) -> torch.Tensor:
    """The selection's candidate buffers for ``q [heads, Lq, D]`` and top-``kk``: ``[programs, BLOCK_M, CAP]``
    int64, one per program of :func:`select_grid`, uninitialised."""
    (programs,) = select_grid(q.shape[0], q.shape[1])
    cap = select_config(kk, q.shape[-1])["CAP"]
    return torch.empty(programs, BLOCK_M, cap, dtype=torch.int64, device=q.device)


def gathered_config(d: int, dv: int) -> dict:
    """Constexprs and launch options of the gathered forward/backward kernels (one query row a program)."""
    chunk = 32 if max(d, dv) <= 64 else 16
    return dict(D=d, D_PAD=pow2_at_least(d), DV=dv, DV_PAD=pow2_at_least(dv), CHUNK=chunk, num_warps=4)


def gathered_grid(heads: int, lq: int) -> tuple[int, int]:
    """The gathered forward's and backward's programs: one a query row."""
    return (lq, heads)


def _gathered_strides(q, k, v, indices, out) -> tuple[int, ...]:
    """The strides the gathered kernels take, in their order: Q's, K's and V's, the indices' and the output's rows."""
    return (*leading_strides(q, 3), *leading_strides(k, 3), *leading_strides(v, 3), *leading_strides(indices, 2),
            *leading_strides(out, 2))  # fmt: skip


@torch.library.custom_op("implementations::triton_topk_select_", mutates_args=("indices", "scratch"))
def topk_select_(
    q: torch.Tensor,
    k: torch.Tensor,
    indices: torch.Tensor,
    causal: bool,
    round_scores: bool,
    groups: int,
    scratch: torch.Tensor | None = None,
) -> None:
    """``indices [heads, Lq, kk]``: each query row's top-``kk`` keys as global key rows (``kv·Lk + j``), by score
    descending (ties: lowest ``j`` first). ``q [heads, Lq, D]``, ``k [kv_heads, Lk, D]``; ``round_scores``: rank by
    the product rounded to the input dtype; ``scratch``: the candidate buffers (:func:`candidate_buffers`; ``None``:
    allocated here, for direct calls: the training path passes its own, so that fake tensors see it)."""
    from topk_bench.attention.kernels.triton import training_kernels as kernels

    heads, lq, d = q.shape
    lk, kk = k.shape[1], indices.shape[-1]
    if heads == 0 or lq == 0:
        return
    config = select_config(kk, d)
    grid = select_grid(heads, lq)
    if scratch is None:
        scratch = candidate_buffers(q, kk)
    if (
        scratch.dtype != torch.int64
        or scratch.shape[0] < grid[0]
        or tuple(scratch.shape[1:]) != (BLOCK_M, config["CAP"])
        or not scratch.is_contiguous()
    ):
        raise ValueError(
            f"topk_select_: scratch must be contiguous int64 [programs, {BLOCK_M}, {config['CAP']}], a buffer for "
            f"each of the {grid[0]} programs"
        )
    launch_kernel(kernels.topk_select_kernel, q.device, grid, q, k, indices, scratch,
                  *leading_strides(q, 3), *leading_strides(k, 3), *leading_strides(indices, 2), lq, lk,
                  causal_offset(lq, lk), heads, groups, kk, CAUSAL=causal, ROUND=round_scores,
                  HALF_DOT=q.device.type == "cuda" and q.dtype != torch.float32, **config)  # fmt: skip


@topk_select_.register_fake
def _(q, k, indices, causal, round_scores, groups, scratch=None) -> None:
    return None


@torch.library.custom_op("implementations::triton_gathered_forward_", mutates_args=("out", "lse"))
def gathered_forward_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    relu: bool,
    round_scores: bool,
    groups: int,
) -> None:
    """``out [heads, Lq, DV]`` = softmax (or relu) of each row's selected scores times the selected V rows;
    ``lse [heads, Lq]`` (float32, contiguous): ``log Σ exp`` of each row's scores (+inf: no allowed key)."""
    from topk_bench.attention.kernels.triton import training_kernels as kernels

    heads, lq, d = q.shape
    lk, kk, dv = k.shape[1], indices.shape[-1], v.shape[-1]
    if heads == 0 or lq == 0:
        return
    launch_kernel(kernels.gathered_forward_kernel, q.device, gathered_grid(heads, lq), q, k, v, indices,
                  out, lse, *_gathered_strides(q, k, v, indices, out), lq, lk, causal_offset(lq, lk),
                  groups, kk, CAUSAL=causal, RELU=relu, ROUND=round_scores, **gathered_config(d, dv))  # fmt: skip


@gathered_forward_.register_fake
def _(q, k, v, indices, out, lse, causal, relu, round_scores, groups) -> None:
    return None


@torch.library.custom_op("implementations::triton_gathered_backward_", mutates_args=("dq", "dk", "dv"))
def gathered_backward_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    causal: bool,
    relu: bool,
    round_scores: bool,
    groups: int,
) -> None:
    """``dq`` (Q's layout) written; ``dk [kv_heads, Lk, D]``, ``dv [kv_heads, Lk, DV]`` (float32, contiguous, zeroed
    by the caller) accumulated. ``dout`` has ``out``'s layout."""
    from topk_bench.attention.kernels.triton import training_kernels as kernels

    heads, lq, d = q.shape
    lk, kk, d_v = k.shape[1], indices.shape[-1], v.shape[-1]
    if heads == 0 or lq == 0:
        return
    launch_kernel(kernels.gathered_backward_kernel, q.device, gathered_grid(heads, lq), q, k, v, indices,
                  out, dout, lse, dq, dk, dv, *_gathered_strides(q, k, v, indices, out), lq, lk,
                  causal_offset(lq, lk), groups, kk, CAUSAL=causal, RELU=relu, ROUND=round_scores,
                  **gathered_config(d, d_v))  # fmt: skip


@gathered_backward_.register_fake
def _(q, k, v, indices, out, dout, lse, dq, dk, dv, causal, relu, round_scores, groups) -> None:
    return None


class _TritonTopk(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, relu, kk, groups, round_scores):
        lead, lq, lk = q.shape[:-2], q.shape[-2], k.shape[-2]
        q3 = q.reshape(-1, lq, q.shape[-1]).contiguous()
        k3 = k.reshape(-1, lk, k.shape[-1]).contiguous()
        v3 = v.reshape(-1, lk, v.shape[-1]).contiguous()
        heads = q3.shape[0]
        index_dtype = torch.int32 if k3.shape[0] * lk < 2**31 else torch.int64
        idx = torch.empty(heads, lq, kk, dtype=index_dtype, device=q.device)
        topk_select_(q3, k3, idx, causal, round_scores, groups, candidate_buffers(q3, kk))
        out = torch.empty(heads, lq, v3.shape[-1], dtype=v.dtype, device=q.device)
        lse = torch.empty(heads, lq, dtype=torch.float32, device=q.device)
        gathered_forward_(q3, k3, v3, idx, out, lse, causal, relu, round_scores, groups)
        ctx.save_for_backward(q3, k3, v3, idx, out, lse)
        ctx.shapes = (q.shape, k.shape, v.shape)
        ctx.flags = (causal, relu, round_scores, groups)
        return out.view(*lead, lq, v3.shape[-1])

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, idx, out, lse = ctx.saved_tensors
        q_shape, k_shape, v_shape = ctx.shapes
        dout3 = dout.reshape(out.shape).contiguous()
        dq = torch.empty_like(q3)
        dk = torch.zeros(k3.shape, dtype=torch.float32, device=k3.device)
        dv = torch.zeros(v3.shape, dtype=torch.float32, device=v3.device)
        gathered_backward_(q3, k3, v3, idx, out, dout3, lse, dq, dk, dv, *ctx.flags)
        return dq.view(q_shape), dk.to(k3.dtype).view(k_shape), dv.to(v3.dtype).view(v_shape), *(None,) * 5


def topk_attention(q, k, v, *, causal: bool, relu: bool, topk: int, groups: int, float_scores: bool):
    """``topk_fast``'s training forward (with autograd) through the Triton kernels; the caller checked
    :func:`unsupported`. ``q [..., Lq, D]``, ``k [..., Lk, D]``, ``v [..., Lk, DV]``, ``groups`` query heads per K/V
    head. Half inputs are ranked by their rounded product unless ``float_scores``."""
    round_scores = q.dtype != torch.float32 and not float_scores
    return _TritonTopk.apply(q, k, v, bool(causal), bool(relu), min(int(topk), k.shape[-2]), groups, round_scores)
