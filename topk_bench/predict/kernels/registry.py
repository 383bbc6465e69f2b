"""The CUDA kernel allocation rules, keyed by aten overload, and the ops that need none.

A :class:`Rule` names the CUDA source (file and function) it models and returns, for one call, the kernel's own
allocations as a program (:mod:`.program`). ``rules/`` registers them with :func:`rule`.

An op with no rule is *modelled* when the fake run already allocates what its CUDA kernel allocates: an op the
catalogue of aten ops (:mod:`topk_bench.aten_ops`) says is ``outputs_only``. Any other op on the CUDA path
is *unmodelled*: its CUDA kernel may allocate scratch or outputs the CPU trace does not show (a cuSOLVER or cuSPARSE
workspace, a cub temporary storage, an output sized otherwise), and a prediction names it (column
``cuda_unmodeled_ops``) instead of silently taking the CPU kernel's allocations for CUDA's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from topk_bench import aten_ops
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


def lookup(func) -> Rule | None:
    return RULES.get(func)


def needs_no_rule(func) -> bool:
    """Whether ``func``'s CUDA kernel allocates what the fake run counts (its catalogue entry is ``outputs_only``),
    or ``func`` runs on the host alone (the profiler's ranges, which stage marks open: no kernel, no device
    memory)."""
    if getattr(func, "namespace", None) in aten_ops.HOST_ONLY_NAMESPACES:
        return True
    return getattr(func, "_schema", None) is not None and aten_ops.of(func).outputs_only


def unmodelled(func) -> bool:
    """An op on the CUDA path with neither a rule nor an outputs-only kernel, or whose rule leaves some of its
    allocations out."""
    found = lookup(func)
    return bool(found.unmodelled) if found is not None else not needs_no_rule(func)
