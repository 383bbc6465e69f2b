"""Test-only attentions that run otherwise than their case asks, each in its own way, so that the child must say so
(``not_as_asked``, topk_bench.child.as_asked):

- ``test_eager_only``: exact softmax attention that torch.compile cannot compile (``torch.compiler.disable``):
  a case with ``compile = true`` runs it eagerly all the same;
- ``test_moving_path``: exact softmax attention that declares a machine-dependent choice (its decode tiles) and
  changes it on its first call, so that the code path the parent found before the case is not the one the
  child ran.
"""

from __future__ import annotations

import torch

import topk_bench.attention
from topk_bench.attention import Implementation
from topk_bench.attention.shared import decode


def softmax_attention(q, k, v, *, causal=False, activation="softmax"):
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        offset = k.shape[-2] - q.shape[-2]
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(offset)
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores.softmax(-1) @ v


eager_only = torch.compiler.disable(softmax_attention)


_planned_tile_bytes = decode.DECODE_TILE_BYTES  # what the parent saw when it imported this plug-in


def moving_path(q, k, v, *, causal=False, activation="softmax"):
    decode.DECODE_TILE_BYTES = 2 * _planned_tile_bytes  # what the machine decides, decided again while the case runs
    return softmax_attention(q, k, v, causal=causal, activation=activation)


for impl in (
    Implementation("test_eager_only", eager_only, "softmax attention torch.compile cannot compile"),
    Implementation(
        "test_moving_path", moving_path, "softmax attention whose code path changes", machine_choices=("decode_tiles",)
    ),
):
    if impl.name not in topk_bench.attention.names():
        topk_bench.attention.register(impl)
