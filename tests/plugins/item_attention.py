"""A test-only attention declared predictable (the registry's default) that reads a value with ``.item()``:
``--predict`` cannot run it, and must say which declaration to change."""

from __future__ import annotations

import topk_bench.attention
from topk_bench.attention import Implementation


def scaled_by_max(q, k, v, *, causal=False, activation="softmax"):
    scores = q @ k.transpose(-2, -1)
    scores = scores / max(1.0, scores.abs().max().item())  # a Python number from a tensor: data-dependent
    return scores.softmax(-1) @ v


if "test_item" not in topk_bench.attention.names():
    topk_bench.attention.register(
        Implementation("test_item", scaled_by_max, "reads a value with .item()", causal=False)
    )
