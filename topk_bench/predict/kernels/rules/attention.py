"""The fused SDPA kernels on CUDA (the backend :mod:`..composites` routed to): aten/src/ATen/native/transformers/cuda/.

Memory-efficient attention (attention.cu ``_efficient_attention_forward``, attention_backward.cu
``_efficient_attention_backward``, mem_eff_attention/kernel_backward.h ``Params::workspace_size``):

- forward: the output ``[B, M, H, Kv]``, the logsumexp ``[B, H, ceil(M / 32) * 32]`` float (when computed),
  an output accumulator ``[B, M, H, Kv]`` float for the kernels that keep the output out of registers (half
  inputs with a head dim over 128: ``kNeedsOutputAccumulatorBuffer``), philox seed and offset on the CPU;
- backward: ``grad_out.contiguous()``, the three gradients (and a bias gradient, last dim aligned to 16), then
  ``delta``: float ``[B, H, M]`` computed by the half kernels (``kKernelComputesDelta``), else on the host as
  ``(grad_out.float() * out.float()).sum(-1).transpose(-2, -1).contiguous()`` (the product, its sum and the
  copy alive together until the end of the expression); then the workspace of the kernel the CUTLASS table
  picks (``dispatch_cutlassB``, the first whose ``kMaxK`` covers the head dim, dropout and sequence alignment
  permitting): per batch and head ``align4(gk + gv + gq)`` floats, ``gq`` the dQ accumulator tiles (one
  ``GradQTempStorage`` of 16 + 4 * BI * BJ bytes per query block and head-dim block, split keys being on from
  sm70), ``gk``, ``gv`` the dK/dV accumulators of the half kernels that keep them out of registers.

Flash attention (flash_attn/flash_api.cpp ``mha_fwd``, ``mha_bwd``; attention_backward.cu
``_flash_attention_backward``):

- forward: output, logsumexp ``[B, H, Lq]`` float, the rng state (2 uint64) and an unused uint64 on the
  device; without dropout the split-KV heuristic (``num_splits_heuristic``) may add ``softmax_lse_accum`` and
  ``out_accum`` (float, per split) for the call;
- backward: contiguous copies of ``grad_out`` and ``out``, the gradients, ``softmax_d`` ``[B, H, round128(Lq)]``,
  the dQ accumulator ``[B, round128(Lq), H, round32(d)]`` float, and for grouped heads ``dk_expanded`` and
  ``dv_expanded`` ``[B, Lk, H, d]`` (summed into dK, dV).

cuDNN attention (cudnn/MHA.cpp): the outputs are modelled; the graph's workspace (``get_workspace_size()``,
chosen by cuDNN's heuristics at run time) is not, and the op is listed as unmodelled.
"""

from __future__ import annotations

import torch

from topk_bench.predict.kernels.program import Call, Free, Out, Step, Temp, nbytes, tensor_bytes
from topk_bench.predict.kernels.registry import aten, rule

CUDA = "aten/src/ATen/native/transformers/cuda"
HALF = (torch.float16, torch.bfloat16)
F32 = torch.float32


def _up(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m``."""
    return -(-x // m) * m


# -- memory-efficient attention -------------------------------------------------------------------------


@rule(aten._scaled_dot_product_efficient_attention.default, source=f"{CUDA}/attention.cu: _efficient_attention_forward")
def efficient_forward(call: Call):
    q, v = call.arg(0, "query"), call.arg(2, "value")
    compute_lse = call.arg(4, "compute_log_sumexp")
    b, h, m, kv = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    steps: list[Step] = [Out(0), Out(1, nbytes((b, h, _up(m, 32)), F32) if compute_lse else 0)]
    if q.dtype in HALF and max(q.shape[3], kv) > 128:  # the gmem kernel (kMaxK 65536): output accumulator
        steps.append(Temp("output_accum", nbytes((b, m, h, kv), F32)))
    return steps + [Out(2, 0), Out(3, 0)]  # philox seed and offset: CPU tensors outside graph capture


# (BI, BJ, kMaxK, applies dropout, needs M % BI == N % BJ == 0), in dispatch_cutlassB_*_sm80 order
_B_F32 = [
    (64, 64, 32, False, False),
    (64, 64, 64, False, False),
    (128, 64, 128, False, False),
    (64, 64, 128, False, False),
    (128, 64, 65536, False, False),
    (64, 64, 65536, False, False),
    (64, 64, 32, True, False),
    (64, 64, 64, True, False),
    (128, 64, 128, True, False),
    (64, 64, 128, True, False),
    (128, 64, 65536, True, False),
    (64, 64, 65536, True, False),
]
_B_HALF = [
    (64, 64, 32, False, True),
    (64, 64, 32, False, False),
    (64, 64, 64, False, True),
    (64, 64, 64, False, False),
    (128, 128, 128, False, True),
    (128, 128, 128, False, False),
    (64, 64, 128, False, True),
    (64, 64, 128, False, False),
    (128, 64, 65536, False, False),
    (64, 64, 65536, False, False),
    (64, 64, 32, True, False),
    (64, 64, 64, True, False),
    (128, 128, 128, True, False),
    (64, 64, 128, True, False),
    (128, 64, 65536, True, False),
    (64, 64, 65536, True, False),
]


def backward_kernel(dtype, head: int, m: int, n: int, dropout: bool) -> tuple[int, int, int]:
    """(BI, BJ, kMaxK) of the first kernel of the sm80 table (used from sm80 to sm99) that can run."""
    for bi, bj, max_k, applies_dropout, aligned in _B_HALF if dtype in HALF else _B_F32:
        if max_k >= head and (applies_dropout or not dropout) and (not aligned or (m % bi == 0 and n % bj == 0)):
            return bi, bj, max_k
    raise AssertionError("the 65536 kernels take any head dim")


def efficient_workspace(q, v, n_keys: int, dropout: bool, capability: int) -> int:
    """``Params::workspace_size()`` of the kernel ``_efficient_attention_backward`` launches."""
    b, h, m, d, dv = q.shape[0], q.shape[1], q.shape[2], q.shape[3], v.shape[3]
    bi, bj, max_k = backward_kernel(q.dtype, max(d, dv), m, n_keys, dropout)
    half = q.dtype in HALF
    accum_kv = half and not max_k <= bi  # !kOutputInRF and float accumulators for half outputs
    splits = -(-n_keys // bj) if capability >= 70 else 1
    if b * h >= 256 and n_keys <= 2 * bj:  # enough parallelism already: one split
        splits = 1
    if accum_kv:
        splits = min(splits, 200 // (b * h))
    splits = max(splits, 1)
    gk = splits * bj * _up(d, bi) if accum_kv else 0
    gv = splits * bj * _up(dv, bi) if accum_kv else 0
    gq = -(-m // bi) * -(-d // bj) * (16 + 4 * bi * bj) // 4  # kNeedsAccumGradQ: split keys from sm70
    return b * h * _up(gk + gv + gq, 4) * 4


@rule(
    aten._scaled_dot_product_efficient_attention_backward.default,
    source=f"{CUDA}/attention_backward.cu: _efficient_attention_backward; mem_eff_attention/kernel_backward.h",
)
def efficient_backward(call: Call):
    grad_out, q, k, v = (call.arg(i, n) for i, n in enumerate(("grad_out_", "query", "key", "value")))
    bias, out = call.arg(4, "attn_bias"), call.arg(5, "out")
    dropout, mask = call.arg(9, "dropout_p"), call.arg(10, "grad_input_mask")
    b, h, m, kv = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    steps: list[Step] = [] if grad_out.transpose(1, 2).is_contiguous() else [Temp("grad_out", tensor_bytes(grad_out))]
    steps += [Out(0), Out(1), Out(2)]
    if bias is not None and mask[3]:
        steps.append(Out(3, nbytes((*bias.shape[:-1], _up(bias.shape[-1], 16)), bias.dtype)))
    if q.dtype in HALF and call.gpu.capability != 70:  # kKernelComputesDelta
        steps.append(Temp("delta", nbytes((b, h, m), F32)))
    else:
        casts = [
            Temp(f"{name}_float", nbytes(t.shape, F32))
            for name, t in (("grad_out", grad_out), ("out", out))
            if t.dtype != F32
        ]
        steps += casts + [
            Temp("product", nbytes((b, m, h, kv), F32)),
            Temp("sum", nbytes((b, m, h), F32)),
            Temp("delta", nbytes((b, h, m), F32)),
            Free("sum"),
            Free("product"),
        ]
        steps += [Free(c.name) for c in reversed(casts)]
    workspace = efficient_workspace(q, v, k.shape[2], dropout > 0, call.gpu.capability)
    return steps + ([Temp("workspace", workspace)] if workspace else []) + [Free("delta")]


# -- flash attention ------------------------------------------------------------------------------------


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """flash_api.cpp ``num_splits_heuristic``: the fewest splits within 85% of the best wave efficiency."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    eligible = [s == 1 or -(-num_n_blocks // s) != -(-num_n_blocks // (s - 1)) for s in range(1, max_splits + 1)]
    waves = [batch_nheads_mblocks * s / num_sms for s in range(1, max_splits + 1)]
    efficiency = [w / -(-w // 1) if ok else 0.0 for w, ok in zip(waves, eligible)]
    best = max(efficiency, default=0.0)
    return next((s for s, (e, ok) in enumerate(zip(efficiency, eligible), 1) if ok and e >= 0.85 * best), 1)


@rule(aten._scaled_dot_product_flash_attention.default, source=f"{CUDA}/flash_attn/flash_api.cpp: mha_fwd")
def flash_forward(call: Call):
    q, k, dropout = call.arg(0, "query"), call.arg(1, "key"), call.arg(3, "dropout_p", 0.0)
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if sq == 1 and h > hk and dropout == 0 and d % 8 == 0:  # seqlenq_ngroups_swapped
        sq, h = h // hk, hk
    steps = []
    if dropout == 0:
        block_n = 256 if d <= 64 else (128 if d <= 128 else 64)
        splits = num_splits_heuristic(b * h * -(-sq // 64), call.gpu.sm_count * 2, -(-sk // block_n), 128)
        if splits > 1:
            rounded = _up(d, 32 if d <= 128 else 64)
            steps += [
                Temp("softmax_lse_accum", nbytes((splits, b, h, sq), F32)),
                Temp("out_accum", nbytes((splits, b, h, sq, rounded), F32)),
            ]
    return [Out(0), Out(1)] + steps  # rng state, unused and the debug mask follow, as the fake run sizes them


@rule(
    aten._scaled_dot_product_flash_attention_backward.default,
    source=f"{CUDA}/attention_backward.cu: _flash_attention_backward; flash_attn/flash_api.cpp: mha_bwd",
)
def flash_backward(call: Call):
    grad_out, q, k, out = call.arg(0, "grad_out"), call.arg(1, "query"), call.arg(2, "key"), call.arg(4, "out")
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    steps: list[Step] = [
        Temp(name, tensor_bytes(t))
        for name, t in (("grad_out", grad_out), ("out", out))
        if not t.transpose(1, 2).is_contiguous()
    ]
    steps += [
        Out(0),
        Out(1),
        Out(2),
        Temp("softmax_d", nbytes((b, h, _up(sq, 128)), F32)),
        Temp("dq_accum", nbytes((b, _up(sq, 128), h, _up(d, 32 if d <= 128 else 64)), F32)),
    ]
    if hk != h:  # MQA / GQA: gradients of every query head, summed into the K/V heads
        expanded = nbytes((b, sk, h, d), q.dtype)
        steps += [
            Temp("dk_expanded", expanded),
            Temp("dv_expanded", expanded),
            Free("dv_expanded"),
            Free("dk_expanded"),
        ]
    return steps + [Free("dq_accum")]


# -- cuDNN attention ------------------------------------------------------------------------------------

CUDNN_WORKSPACE = "the cuDNN graph's workspace (get_workspace_size(), cuDNN's own heuristics) is not modelled"


@rule(
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
    source="aten/src/ATen/native/cudnn/MHA.cpp: run_cudnn_SDP_fprop, run_cudnn_SDP_bprop",
    unmodelled=CUDNN_WORKSPACE,
)
def cudnn(call: Call):
    return []
