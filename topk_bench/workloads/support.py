"""Can this case run? The one rule, asked by the suite checks (bad input), the runner and the child (status).

A case calls one or more attention implementations (its ``impl``, and the
feed-forward implementation of a workload that has one); each must support the
activation and masking it is called with, and, for ``--predict``, run under
FakeTensorMode — as must the workload itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import implementations
from topk_bench.case import Case
from topk_bench.workloads.spec import get


@dataclass(frozen=True)
class AttentionUse:
    """One attention implementation a case calls, and how."""

    impl: str
    activation: str
    causal: bool


def feedforward_of(case: Case) -> str | None:
    """The feed-forward implementation a case runs (None: none, or the model's own)."""
    spec = get(case.workload)
    return case.ff_impl or (spec.default_feedforward if spec.feedforward else None)


def uses(case: Case) -> list[AttentionUse]:
    """The attention calls of a case: its attention, then its feed-forward layer as ``ReLU(Q Kᵀ) V``."""
    spec = get(case.workload)
    fixed = {name: rule.value for name, rule in spec.fixed.items()}  # what the workload runs, whatever the case says
    out = [AttentionUse(case.impl, fixed.get("activation", case.activation), fixed.get("causal", case.causal))]
    feedforward = feedforward_of(case)
    if feedforward is not None:
        out.append(AttentionUse(feedforward, "relu", False))
    return out


def capability_problem(impl: implementations.Implementation, activation: str, causal: bool) -> str | None:
    """Why ``impl`` cannot be called with this activation and masking, or None."""
    if activation not in impl.activations:
        return (f"implementation {impl.name!r} does not support activation {activation!r} "
                f"(supports: {', '.join(impl.activations)})")
    if causal and not impl.causal:
        return f"implementation {impl.name!r} does not support causal masking"
    return None


def unsupported(case: Case, *, predict: bool) -> str | None:
    """Why ``case`` cannot run (``predict``: cannot be predicted), or None when it can."""
    for use in uses(case):
        impl = implementations.spec(use.impl)
        problem = capability_problem(impl, use.activation, use.causal)
        if problem:
            return problem
        if predict and not impl.predictable:
            return f"{impl.name} cannot be predicted (data-dependent operations do not run under FakeTensorMode)"
    if predict and not get(case.workload).predictable:
        return f"the {case.workload} workload cannot be predicted (it is measured only)"
    return None
