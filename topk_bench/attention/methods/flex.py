"""PyTorch FlexAttention (``torch.nn.attention.flex_attention``, "FlexAttention: A Programming
Model for Generating Optimized Attention Kernels", Dong et al., 2024) with causal and
sliding-window block masks.

``window = 0``: full attention, or causal when ``causal``; ``window > 0``: each query
sees the last ``window`` keys up to and including its own position (the band of
``sink_window`` without sinks; the band already excludes future keys, so ``causal``
changes nothing). Causal alignment is bottom-right (query ``i`` sits at
``Lk - Lq + i``): the mask functions see that offset. A row with no allowed key gives
zeros. Grouped-query heads: native (``enable_gqa``, no repeated K/V). Dtypes: what
FlexAttention takes (on CPU float32/float16/bfloat16, not float64), output in the
input dtype.

Compilation: the function runs ``torch.compile(flex_attention)``; the first call for
each new combination of shapes, dtype, device, mask (``causal``, ``window``,
``Lk - Lq``) and gradient mode compiles a kernel (about 20 s on a 2-core CPU), later
calls reuse it. To keep compilation out of a timed region, call :func:`warm_up` (or
the function once) with tensors of the case's shapes and the same options first; it
returns the seconds the call took, i.e. the compile time.

What this torch cannot do raises ``NotImplementedError`` (the harness records the case
``unsupported``): FlexAttention's backward on CPU (torch's CPU path compiles the
forward only) and float64 on CPU; activations other than softmax are a ``ValueError``
as elsewhere.
Not predictable: a compiled call is not run under ``FakeTensorMode`` (nor under any
dispatch mode: the harness measures its CPU memory from the allocator's reports).
"""

from __future__ import annotations

import time

import torch

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.masking import allowed_keys, check_activation, check_qkv, query_positions

OPTIONS = {"window": 0}

_COMPILED = None
_MASKS: dict = {}  # block masks by (Lq, Lk, causal, window, device): built once per shape


def _flex_api():
    try:
        from torch.nn.attention import flex_attention as api
    except ImportError:  # torch < 2.5
        raise NotImplementedError(f"flex: torch {torch.__version__} has no torch.nn.attention.flex_attention") from None
    return api


def _compiled():
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(_flex_api().flex_attention)
    return _COMPILED


def _block_mask(lq: int, lk: int, causal: bool, window: int, device):
    """The FlexAttention block mask, or None for full attention."""
    if window == 0 and not causal:
        return None
    key = (lq, lk, causal, window, str(device))
    if key not in _MASKS:
        offset = lk - lq

        if window:

            def mask_mod(b, h, q_idx, kv_idx):
                pos = q_idx + offset
                return (kv_idx <= pos) & (kv_idx > pos - window)
        else:

            def mask_mod(b, h, q_idx, kv_idx):
                return kv_idx <= q_idx + offset

        _MASKS[key] = _flex_api().create_block_mask(mask_mod, None, None, lq, lk, device=device)
    return _MASKS[key]


def flex_attention(q, k, v, *, causal=False, activation="softmax", window=0):
    """``softmax(q kᵀ) v`` through compiled FlexAttention (q already scaled: ``scale=1``)."""
    check_activation(activation, "flex", ("softmax",))
    check_qkv(q, k, v, batched=True)
    window = int(window)
    if window < 0:
        raise ValueError(f"flex needs window >= 0, got {window}")
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise NotImplementedError(
            f"flex: FlexAttention has no backward on CPU in torch {torch.__version__} "
            "(forward only: run under no_grad, or on CUDA)"
        )
    if q.device.type == "cpu" and q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise NotImplementedError(f"flex: FlexAttention on CPU takes float32/float16/bfloat16, not {q.dtype}")
    mask = _block_mask(q.shape[2], k.shape[2], bool(causal), window, q.device)
    return _compiled()(q, k, v, block_mask=mask, scale=1.0, enable_gqa=q.shape[1] != k.shape[1])


def warm_up(q, k, v, *, causal=False, window=0) -> float:
    """Compile (if needed) for these shapes and options by one call; returns its wall seconds."""
    start = time.perf_counter()
    flex_attention(q, k, v, causal=causal, window=window)
    return time.perf_counter() - start


def flex_selection(q, k, *, causal=False, window=0, **_ignored):
    """Bool ``[B, Hq, Lq, Lk]`` of the keys each query sees (the mask of :func:`flex_attention`)."""
    check_qkv(q, k, k, batched=True)
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    if window:
        cols = torch.arange(lk, device=q.device)
        pos = query_positions(0, lq, lq, lk, q.device).unsqueeze(1)
        keys = (cols <= pos) & (cols > pos - int(window))
    else:
        keys = allowed_keys(0, lq, lq, lk, causal=causal, device=q.device)
        if keys is None:
            keys = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    return keys.expand(b, hq, lq, lk).clone()


FLEX = register(
    Implementation(
        name="flex",
        fn=flex_attention,
        description="torch FlexAttention (compiled), causal or sliding-window block mask; CPU: forward only",
        options=OPTIONS,
        label="FlexAttention (window={window})",
        activations=("softmax",),
        exact=False,  # window > 0 is a sliding window (window = 0 is exact attention)
        predictable=False,
        gqa="native",
        selection=flex_selection,
        budget=lambda tokens, options: {"window": max(1, int(tokens))},  # the last `tokens` keys
        compiles=True,
    )
)
