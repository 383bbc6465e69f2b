"""The costs of custom ops, declared by rules that the GPU time model (:mod:`topk_bench.predict.timing`) reads, and
the counts those rules share with the model's costs of aten ops.

``torch.utils.flop_counter`` knows no custom op: a custom op (a Triton kernel) declares what its kernels cost with
:func:`register_cost`, by the op's qualified name. topk_bench/attention/'s ops are declared in
:mod:`topk_bench.predict.custom_op_costs`; another package's op wherever it is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from topk_bench.aten_ops import KernelClass


@dataclass(frozen=True)
class Cost:
    """What a custom op's kernel costs, as its declaration computes it from one call's arguments."""

    kind: KernelClass
    flops: float
    bytes: float
    blocks: int = 0
    lanes: int = 0
    round_trips: int = 0  # the longest program's loads that each wait for the one before (a serial loop)


# (args, kwargs) of one call -> its Cost, or one Cost per kernel of an op that launches a chain of them
CostRule = Callable[..., "Cost | tuple[Cost, ...]"]
_DECLARED: dict[str, CostRule] = {}


def register_cost(qualified_name: str) -> Callable[[CostRule], CostRule]:
    """Declare the cost of custom op ``namespace::name``: ``rule(args, kwargs)`` of one call returns its
    :class:`Cost` (or one per kernel of a chain)."""

    def declare(rule: CostRule) -> CostRule:
        _DECLARED[qualified_name] = rule
        return rule

    return declare


def declared_cost(qualified_name: str) -> CostRule | None:
    """The rule declared for custom op ``namespace::name`` (None: none is)."""
    return _DECLARED.get(qualified_name)


def nbytes(t: torch.Tensor) -> int:
    """What a kernel touches of ``t``: its elements, at most its storage (an expanded tensor reads its storage)."""
    size = t.numel() * t.element_size()
    try:
        return min(size, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor with no storage (sparse): its elements
        return size


def causal_share(q_len: int, k_len: int, *, offset: int) -> float:
    """The share of a ``[q_len, k_len]`` score matrix that a causal mask keeps, query ``i`` seeing keys
    ``0 .. i + offset``: ``offset = 0`` aligns the mask top-left (SDPA's ``is_causal``), ``k_len - q_len``
    bottom-right (the registry's convention: ``topk_bench.attention.shared.masking.causal_offset``)."""
    if q_len <= 0 or k_len <= 0:
        return 1.0
    # Row i keeps clamp(i + offset + 1, 0, k_len) keys: the rows that see some but not all of them, then the
    # rows that see all.
    first, last = max(offset + 1, 1), min(offset + q_len, k_len)
    partial = (first + last) * (last - first + 1) // 2 if first <= last else 0
    full = max(0, offset + q_len - max(offset, k_len)) * k_len
    return (partial + full) / (q_len * k_len)
