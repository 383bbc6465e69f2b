"""Test-only attention implementations whose numbers are not finite: a NaN output, a NaN gradient."""

from __future__ import annotations

import torch

import topk_bench.attention
from topk_bench.attention import Implementation


def nan_output(q, k, v, *, causal=False, activation="softmax"):
    return q * float("nan")


class _NanBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q):
        return q.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def nan_gradient(q, k, v, *, causal=False, activation="softmax"):
    return _NanBackward.apply(q)


for name, fn in (("nan_output", nan_output), ("nan_gradient", nan_gradient)):
    topk_bench.attention.register(Implementation(name=name, fn=fn, description=f"test: {name.replace('_', ' ')}"))
