"""Which path a CUDA call of ``topk_fast`` or ``page_topk`` takes where both the Triton kernels and the torch path
can serve it: ``TOPK_BENCH_TRITON`` (read at every call), else the path an H200 measured faster (:data:`DEFAULTS`).

- ``TOPK_BENCH_TRITON=1``: the kernels wherever they take the call (their limits, :func:`..unsupported` and the
  decode ``*_unsupported``, still send a call to the torch path);
- ``TOPK_BENCH_TRITON=0``: never the kernels;
- unset or empty: :data:`DEFAULTS`, per implementation and operation.

The row's ``code_path`` (key ``triton_kernels``) says which: ``triton:<version>``, or ``torch:`` and why
(:data:`DEFAULT_TORCH` where the table chose the torch path).
"""

from __future__ import annotations

import os

SWITCH_ENV = "TOPK_BENCH_TRITON"
FORCE, DISABLE = "1", "0"
TRITON, TORCH = "triton", "torch"
TRAINING, DECODE = "training", "decode"

# The path of each operation with SWITCH_ENV unset: the faster one on one warm H200 (sm_90, torch 2.11, triton 3.6.0),
# medians of tests/data/h200-2026-11-28/triton/ against tests/data/h200-2026-11-28/torch-path/ (the files named).
DEFAULTS = {
    # topk_fast_cuda-float32.csv, causal BERT-base MHA forward + backward: torch 57.2 ms against Triton 104.3 ms at
    # 16K (361.6 against 1459.9 at 64K); topk_fast_cuda-bfloat16.csv: Triton 297.9 ms at 16K, 77x SDPA's 3.85 ms.
    ("topk_fast", TRAINING): TORCH,
    # kv_targets-cudagraph.csv, one Llama-3-8B bf16 decode step over 131072 keys, 1/16 budget, CUDA graph: torch
    # 0.957 ms against Triton 2.202 ms.
    ("topk_fast", DECODE): TORCH,
    # kv_targets-cudagraph.csv, the same step: Triton 0.187 ms against torch 0.184 ms (1.6% apart), peak 544.7 MiB
    # against 597.2 MiB: the smaller footprint decides.
    ("page_topk", DECODE): TRITON,
}
# ``code_path``'s reason (after ``torch:``) where DEFAULTS chose the torch path: no ``;`` or ``=`` (the column's
# separators, topk_bench/attention/provenance.py).
DEFAULT_TORCH = "default (faster on an H200)"


def switch() -> str | None:
    """:data:`FORCE`, :data:`DISABLE`, or None (unset: :data:`DEFAULTS`); any other value is a ``ValueError``."""
    value = os.environ.get(SWITCH_ENV, "")
    if value not in ("", FORCE, DISABLE):
        raise ValueError(
            f"{SWITCH_ENV}={value!r}: expected 1 (the Triton kernels wherever they take the call), 0 (never) or unset "
            "(the path measured faster, topk_bench/attention/kernels/triton/defaults.py)"
        )
    return value or None


def declined(impl: str, operation: str) -> str | None:
    """Why ``impl``'s ``operation`` (:data:`TRAINING` or :data:`DECODE`) does not take the kernels whatever the call
    (None: it does where they support it): disabled by :data:`SWITCH_ENV`, or the torch path by :data:`DEFAULTS` (an
    operation it does not list takes the kernels)."""
    value = switch()
    if value == DISABLE:
        return f"disabled by {SWITCH_ENV}=0"
    if value is None and DEFAULTS.get((impl, operation), TRITON) == TORCH:
        return DEFAULT_TORCH
    return None


def declined_for(impl: str) -> str | None:
    """:func:`declined` for all of ``impl``'s operations in :data:`DEFAULTS` (what its ``code_path`` says): the
    reason when none of them takes the kernels, else None."""
    reasons = [declined(impl, operation) for name, operation in DEFAULTS if name == impl] or [declined(impl, "")]
    return reasons[0] if all(reasons) else None
