"""A test-only top-k attention that keeps each query's ``topk`` *smallest* scores instead of its largest.

Where it keeps every key (``topk`` at least the keys: the doctor's covering check) it is exact softmax attention,
so only a check where it drops keys can tell it from top-k attention: ``doctor`` must fail it there.
"""

from __future__ import annotations

import torch

import topk_bench.attention
from topk_bench.attention import Implementation


def smallest_topk(q, k, v, *, causal=False, activation="softmax", topk=128, chunk_size=1024):
    scores = q @ k.transpose(-2, -1)
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
    if causal:
        keep = keep.tril(k.shape[-2] - q.shape[-2])
    # The smallest of the keys a query may see (the masked ones last), weighted by a softmax over them.
    picked = scores.masked_fill(~keep, float("inf")).topk(min(topk, k.shape[-2]), dim=-1, largest=False).indices
    weights = scores.masked_fill(~keep, float("-inf")).gather(-1, picked).softmax(dim=-1)
    kept = v.unsqueeze(-3).expand(*q.shape[:-1], *v.shape[-2:])
    kept = kept.gather(-2, picked.unsqueeze(-1).expand(*picked.shape, v.shape[-1]))
    return (weights.unsqueeze(-1) * kept).sum(dim=-2)


if "test_smallest_topk" not in topk_bench.attention.names():
    topk_bench.attention.register(
        Implementation(
            "test_smallest_topk",
            smallest_topk,
            "keeps each query's smallest scores",
            options={"topk": 128, "chunk_size": 1024},
            exact=False,
        )
    )
