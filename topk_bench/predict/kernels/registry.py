"""The CUDA kernel allocation rules, keyed by aten overload, and the ops that need none.

A :class:`Rule` names the CUDA source (file and function) it models and returns, for one call, the kernel's own
allocations as a program (:mod:`.program`). ``rules/`` registers them with :func:`rule`.

An op with no rule is *modelled* when the fake run already allocates what its CUDA kernel allocates: the op
families of :data:`OUTPUTS_ONLY`, each with the reason. Any other op on the CUDA path is *unmodelled*: its CUDA
kernel may allocate scratch or outputs the CPU trace does not show (a cuSOLVER or cuSPARSE workspace, a cub
temporary storage, an output sized otherwise), and a prediction names it (column ``cuda_unmodeled_ops``)
instead of silently taking the CPU kernel's allocations for CUDA's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from topk_bench.predict.kernels.program import Call, Step

aten = torch.ops.aten


@dataclass(frozen=True)
class Rule:
    op: torch._ops.OpOverload
    source: str  # "file: function" of the CUDA source it models
    steps: Callable[[Call], list[Step]]
    unmodelled: str = ""  # what of the kernel's allocations the rule leaves out, if any


RULES: dict[torch._ops.OpOverload, Rule] = {}


def rule(*ops: torch._ops.OpOverload, source: str, unmodelled: str = ""):
    """Register the decorated ``steps(call) -> [Step]`` for each of ``ops`` (an op has one rule); ``unmodelled``:
    what the rule cannot size (the op is then still listed as unmodelled)."""

    def register(steps: Callable[[Call], list[Step]]) -> Callable[[Call], list[Step]]:
        for op in ops:
            if op in RULES:
                raise ValueError(f"{op} already has a rule ({RULES[op].source})")
            RULES[op] = Rule(op, source, steps, unmodelled)
        return steps

    return register


def _packets(*names: str) -> frozenset[str]:
    return frozenset(f"aten::{n}" for n in names)


# Op families whose CUDA kernels allocate their outputs and nothing else (or scratch below the allocator's
# granule that is not modelled, said per family); the fake run counts those outputs as CUDA does.
OUTPUTS_ONLY: dict[str, frozenset[str]] = {
    # Views and metadata: no allocation at all.
    "views": _packets(
        "view",
        "_unsafe_view",
        "reshape",
        "transpose",
        "t",
        "expand",
        "unsqueeze",
        "squeeze",
        "permute",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "alias",
        "detach",
        "as_strided",
        "diagonal",
        "narrow",
        "unbind",
        "unfold",
        "_reshape_alias",
        "view_as_real",
        "lift_fresh",
        "lift_fresh_copy",
        "_conj",
        "_neg_view",
        "resolve_conj",
        "resolve_neg",
    ),
    # Factories and in-place fills, random draws included (Distributions*.cu: philox offsets, no buffer).
    "factories": _packets(
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "arange",
        "scalar_tensor",
        "randn",
        "rand",
        "randint",
        "uniform_",
        "normal_",
        "bernoulli_",
        "fill_",
        "zero_",
        "tril_",
        "triu_",
        "tril",
        "triu",
    ),
    # TensorIterator element-wise kernels (Loops.cuh) and copies (Copy.cu): outputs only.
    "elementwise": _packets(
        "add",
        "sub",
        "mul",
        "div",
        "neg",
        "exp",
        "log",
        "relu",
        "threshold_backward",
        "gt",
        "ge",
        "lt",
        "le",
        "eq",
        "ne",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_not",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "__rshift__",
        "__lshift__",
        "__and__",
        "__or__",
        "__xor__",
        "clamp",
        "clamp_min",
        "clamp_max",
        "where",
        "masked_fill",
        "pow",
        "remainder",
        "floor_divide",
        "copy",
        "copy_",
        "_to_copy",
        "clone",
        "abs",
        "sqrt",
        "rsqrt",
        "sigmoid",
        "tanh",
        "logical_not",
        "logical_and",
        "logical_or",
        "maximum",
        "minimum",
        "sign",
        "reciprocal",
        "square",
        "gelu",
        "gelu_backward",
        "silu",
        "silu_backward",
        "sigmoid_backward",
        "tanh_backward",
        "add_",
        "sub_",
        "mul_",
        "div_",
        "exp_",
        "relu_",
        "clamp_",
        "clamp_min_",
        "clamp_max_",
        "masked_fill_",
        "neg_",
        "sqrt_",
        "pow_",
        "logical_not_",
        "bitwise_and_",
        "bitwise_or_",
        "bitwise_xor_",
        "lerp",
        "addcmul",
        "addcdiv",
        "native_dropout",
        "native_dropout_backward",
    ),
    # Gather/scatter/index kernels (Indexing.cu, ScatterGatherKernel.cu): outputs only for these overloads
    # (index_put_ without accumulate goes through TensorIterator, not the sort-based kernel).
    "indexing": _packets(
        "index_select",
        "gather",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "scatter_reduce",
        "scatter_reduce_",
        "index",
        "index_put",
        "index_put_",
        "_index_put_impl_",
        "masked_select_backward",
        "take",
    ),
    # Concatenation (Shape.cu: input pointers travel in pinned host memory, not on the device).
    "concatenation": _packets(
        "cat", "stack", "repeat", "roll", "flip", "constant_pad_nd", "slice_backward", "select_backward", "diag_embed"
    ),
    # Reductions (Reduce.cuh): a reduction split over several blocks per output also allocates a staging buffer
    # and semaphores (ctas_per_output accumulators per output, a few KiB), not modelled.
    "reductions": _packets(
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "argmax",
        "argmin",
        "any",
        "all",
        "prod",
        "linalg_vector_norm",
        "norm",
        "var",
        "std",
        "var_mean",
        "logsumexp",
        "cumsum",
    ),
}
_MODELLED = frozenset().union(*OUTPUTS_ONLY.values())
HOST_ONLY_NAMESPACES = frozenset({"profiler"})


def lookup(func) -> Rule | None:
    return RULES.get(func)


def needs_no_rule(func) -> bool:
    """Whether ``func``'s CUDA kernel allocates what the fake run counts (:data:`OUTPUTS_ONLY`), or ``func``
    runs on the host alone (the profiler's ranges, which stage marks open: no kernel, no device memory)."""
    if getattr(func, "namespace", None) in HOST_ONLY_NAMESPACES:
        return True
    packet = getattr(func, "_schema", None)
    return packet is not None and func._schema.name in _MODELLED


def unmodelled(func) -> bool:
    """An op on the CUDA path with neither a rule nor a place in :data:`OUTPUTS_ONLY`, or whose rule leaves
    some of its allocations out."""
    found = lookup(func)
    return bool(found.unmodelled) if found is not None else not needs_no_rule(func)
