"""A test-only attention that is wrong on purpose: it forgets the softmax's normalisation.

It claims to be exact (the registry's default), so ``topk-bench doctor --plugins`` must
compare it with vanilla and fail it, by name.
"""

from __future__ import annotations

import torch

import topk_bench.attention
from topk_bench.attention import Implementation


def unnormalised(q, k, v, *, causal=False, activation="softmax"):
    scores = q @ k.transpose(-2, -1)
    if causal:
        offset = k.shape[-2] - q.shape[-2]
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(offset)
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores.exp() @ v


if "test_wrong" not in topk_bench.attention.names():
    topk_bench.attention.register(Implementation("test_wrong", unnormalised, "softmax without its normaliser"))
