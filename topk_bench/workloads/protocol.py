"""How a case's protocol builds its attention layers (:mod:`topk_bench.protocol`); ours adds nothing.

Under ``paper``, as the authors' benchmark code did:

- the attention multiplies its scores by ``head_dim ** -0.5`` inside the activation
  (``MultiHeadAttention(scale_in_attention=True)``), wherever the implementation has a ``scale``
  option (the paper variants); the others (ours, Performer, SDPA) keep receiving a scaled ``q``;
- a causal vanilla gets the whole ``L x L`` bool mask, built here with the model, before the
  measured region, and alive through it: an input of the layer, counted in ``baseline_bytes`` as
  the authors' was (they built it once, before their timing loop, for their vanilla only; their
  query chunking builds a ``C x Lk`` one per chunk, inside the measured region).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import topk_bench.attention
from topk_bench.attention.methods.paper import causal_mask
from topk_bench.case import Case
from topk_bench.protocol import PAPER

# The implementations whose causal mask the authors built whole, before timing.
KEPT_MASK = frozenset({"vanilla_paper"})


@dataclass(frozen=True)
class LayerSetup:
    """What a protocol adds to a ``MultiHeadAttention``: keyword arguments, and the tensors they hold."""

    options: dict[str, Any] = field(default_factory=dict)
    kept: tuple[torch.Tensor, ...] = ()


def attention_layer(case: Case, seq_len: int, device) -> LayerSetup:
    """The ``MultiHeadAttention`` arguments of ``case``'s protocol for self-attention over ``seq_len`` tokens.

    Built on ``device`` (under FakeTensorMode, a fake mask). A decoder's layers share one mask, as theirs.
    """
    if case.protocol != PAPER.name:
        return LayerSetup()
    options: dict[str, Any] = {}
    if "scale" in topk_bench.attention.spec(case.impl).options:
        options["scale_in_attention"] = True
    if case.impl not in KEPT_MASK or not case.causal:
        return LayerSetup(options)
    mask = causal_mask(0, seq_len, seq_len, seq_len, device)  # True = masked, one byte per pair
    return LayerSetup({**options, "mask": mask}, (mask,))
