"""The doctor's cases: one tiny mha layer per implementation, in a configuration comparable with vanilla.

Heads of 16 (:data:`SHAPE`), the least FlexAttention compiles for on CUDA. Chunks, pages and blocks are made small
so that the chunked code paths really run (10
tokens in chunks of 3: the last one partial). The options that bound which keys a
selection method attends (``topk``, ``token_budget``, ``topk_blocks``, ``window``) are set
to cover every key and ``dropout`` is off, so that top-k, page, block and window
selection are exact and must agree with vanilla (a top-k method is also judged where it drops keys:
:func:`topk_bench.doctor.agreement.dropping`). An approximate implementation without
such an option (Performer: random features) is compared with itself on the CPU instead.
Causal masking wherever an implementation supports it (the paper's setting, and the one
with the most code).
"""

from __future__ import annotations

from typing import Any

from topk_bench import attention
from topk_bench.case import Case
from topk_bench.types import Method

# Heads of 16: the CUDA FlexAttention compiler refuses a head_dim below 16 (BackendCompilerFailed).
SHAPE = {"seq_len": 10, "batch": 2, "d_model": 32, "heads": 2}
# The warm-up a run gives each case by default (bench.toml): the timer's samples are warm.
WARMUP, WARMUP_S = 2, 0.025
SMALL = {"chunk_size": 3, "page_size": 2, "block_size": 2, "nb_features": 8, "sinks": 1}
COVERING = {
    "topk": SHAPE["seq_len"],
    "token_budget": SHAPE["seq_len"],
    "topk_blocks": SHAPE["seq_len"],
    "window": SHAPE["seq_len"],
    "dropout": 0.0,
}


def measured() -> list[attention.Implementation]:
    """The implementations the doctor judges: every registered one (plug-ins too) but its own probes."""
    from topk_bench.doctor.probes import NAMES

    return [impl for impl in attention.all_specs() if impl.name not in NAMES]


def options(impl: attention.Implementation) -> dict[str, Any]:
    return {key: value for key, value in {**SMALL, **COVERING}.items() if key in impl.options}


def comparable_with_vanilla(impl: attention.Implementation) -> bool:
    """Exact, or made exact by covering every key."""
    return impl.exact or (impl.exact_when_covering and any(key in impl.options for key in COVERING if key != "dropout"))


def case(
    impl: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    workload: str = "mha",
    params: dict[str, Any] | None = None,
    option_overrides: dict[str, Any] | None = None,
    plugins: tuple[str, ...] = (),
    method: Method = Method.MEASURED,
    repeats: int = 1,
) -> Case:
    spec = attention.spec(impl)
    return Case.make(
        suite="doctor",
        workload=workload,
        impl=impl,
        params=params or SHAPE,
        options={**options(spec), **(option_overrides or {})},
        causal=spec.causal,
        activation="softmax",
        dtype=dtype,
        device=device,
        method=method,
        warmup=WARMUP,
        warmup_s=WARMUP_S,
        repeats=repeats,
        plugins=plugins,
    )
