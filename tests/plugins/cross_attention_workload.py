"""A workload registered from a plug-in file, as a user would write one: cross-attention of ``seq_len``
queries over a memory of ``memory_len`` tokens (a parameter no built-in workload has)."""

from __future__ import annotations

import math

import torch
from torch import nn

import topk_bench.attention
from topk_bench import workloads


class CrossAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, impl: str, **options):
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.attention = topk_bench.attention.spec(impl).module(self.head_dim, **options)

    def _split(self, x):
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, memory):
        q = self._split(self.q(x) / math.sqrt(self.head_dim))
        out = self.attention(q, self._split(self.k(memory)), self._split(self.v(memory)), causal=False)
        return out.transpose(1, 2).reshape(x.shape)


def build(case, device, dtype):
    p = CROSS.shape(case)
    model = CrossAttention(p["d_model"], p["heads"], case.impl, **case.option_dict)
    x = workloads.hidden_states(p["batch"], p["seq_len"], p["d_model"], device, dtype)
    memory = torch.randn(p["batch"], p["memory_len"], p["d_model"], device=device, dtype=dtype)
    return workloads.Workload(model, (x, memory))


CROSS = workloads.register(
    workloads.WorkloadSpec(
        name="cross_attention",
        description="queries of one sequence over the keys and values of another (encoder memory)",
        build=build,
        params={"seq_len": 64, "memory_len": 256, "batch": 1, "d_model": 32, "heads": 2},
        fixed={"causal": workloads.Fixed(False, "cross-attention has no causal mask: expected causal = false")},
    )
)
