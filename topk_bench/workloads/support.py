"""Can this case run? The one rule, asked by the suite checks (bad input), the runner and the child (status).

A case calls one or more attention implementations (its ``impl``, and the
feed-forward implementation of a workload that has one); each must support the
activation and masking it is called with, grouped K/V heads when the case has fewer
K/V heads than query heads (an implementation registered with ``gqa=None``, a plug-in
say, is then ``unsupported``: never run on inputs it would misread), and, for
``--predict``, run under FakeTensorMode — as must the workload itself, uncompiled.
"""

from __future__ import annotations

from dataclasses import dataclass

import topk_bench.attention
from topk_bench.case import Case
from topk_bench.workloads.spec import lookup


@dataclass(frozen=True)
class AttentionUse:
    """One attention implementation a case calls, and how."""

    impl: str
    activation: str
    causal: bool
    grouped: bool = False  # fewer K/V heads than query heads


def feedforward_of(case: Case) -> str | None:
    """The feed-forward implementation a case runs (None: none, or the model's own)."""
    spec = lookup(case.workload)
    return case.ff_impl or (spec.default_feedforward if spec.feedforward else None)


def uses(case: Case) -> list[AttentionUse]:
    """The attention calls of a case: its attention, then its feed-forward layer as ``ReLU(Q Kᵀ) V``."""
    spec = lookup(case.workload)
    fixed = {name: rule.value for name, rule in spec.fixed.items()}  # what the workload runs, whatever the case says
    grouped = spec.grouped_heads is not None and spec.grouped_heads(spec.shape(case))
    out = [AttentionUse(case.impl, fixed.get("activation", case.activation), fixed.get("causal", case.causal), grouped)]
    feedforward = feedforward_of(case)
    if feedforward is not None:
        out.append(AttentionUse(feedforward, "relu", False))
    return out


def capability_problem(
    impl: topk_bench.attention.Implementation, activation: str, causal: bool, grouped: bool = False
) -> str | None:
    """Why ``impl`` cannot be called with this activation, masking and K/V heads, or None."""
    if activation not in impl.activations:
        return (
            f"implementation {impl.name!r} does not support activation {activation!r} "
            f"(supports: {', '.join(impl.activations)})"
        )
    if causal and not impl.causal:
        return f"implementation {impl.name!r} does not support causal masking"
    if grouped and impl.gqa is None:
        return (
            f"implementation {impl.name!r} does not support grouped K/V heads "
            "(kv_heads < q_heads; registered without gqa)"
        )
    return None


def unsupported(case: Case, *, predict: bool) -> str | None:
    """Why ``case`` cannot run (``predict``: cannot be predicted), or None when it can."""
    for use in uses(case):
        impl = topk_bench.attention.spec(use.impl)
        problem = capability_problem(impl, use.activation, use.causal, use.grouped)
        if problem:
            return problem
        if predict and not impl.predictable:
            return f"{impl.name} cannot be predicted (data-dependent operations do not run under FakeTensorMode)"
    if predict and case.compile:
        return (
            "compile = true: a compiled case is measured, not predicted (the compiler decides what it "
            "allocates; FakeTensorMode would run it eagerly)"
        )
    if predict and not lookup(case.workload).predictable:
        return f"the {case.workload} workload cannot be predicted (it is measured only)"
    return None
