"""A pretrained BERT feed-forward sublayer cast as attention, computed by a registry implementation.

BERT's FF is ``GELU(x W1ᵀ + b1) W2ᵀ + b2``. As attention (paper Eq. 3): the
tokens are the queries, the keys are ``[W1 | b1]`` against queries ``[x | 1]``
(so the scores include the bias exactly), the values are ``W2ᵀ``.

The registry's activations are softmax and ReLU, not GELU, so there are two
honest ways to plug an implementation into a GELU model (``activation``):

- ``"gelu"`` (default, the model unchanged): each implementation contributes its
  *selection rule* and GELU is applied to the kept pre-activations. Exact
  implementations keep every key (``qchunk`` does so one query chunk at a time);
  top-k implementations keep the k largest pre-activations per token, then GELU,
  and drop the rest. This is the paper's top-k FF with GELU in place of ReLU:
  the dropped terms ``GELU(z)`` of small or negative ``z`` are what is lost
  (GELU is not zero below 0, down to -0.17, so even k = d_ff - 1 is not exact).
  Implementations that compute softmax only (SDPA, Performer: random
  features approximate the softmax kernel, not GELU or ReLU) are unsupported at FF.
- ``"relu"``: the model's GELU is replaced by ReLU and the registry function
  itself runs with ``activation="relu"``. This changes the model even for
  ``vanilla`` (its own error against the original is the floor of this mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from topk_bench.attention.registry import spec

FF_ACTIVATIONS = ("gelu", "relu")


class UnsupportedAtFeedForward(ValueError):
    """The implementation has no meaning for this FF (e.g. Performer approximates softmax only)."""


class AttentionFeedForward(nn.Module):
    """Drop-in for BERT's ``intermediate.dense -> GELU -> output.dense`` (without the residual LayerNorm)."""

    def __init__(
        self,
        up: nn.Linear,
        down: nn.Linear,
        impl: str,
        options: Mapping[str, Any] | None = None,
        activation: str = "gelu",
    ):
        super().__init__()
        if activation not in FF_ACTIVATIONS:
            raise ValueError(f"FF activation must be one of {FF_ACTIVATIONS}, got {activation!r}")
        self.spec = spec(impl)
        self.options = self.spec.resolve(options)
        self.activation = activation
        # Shared with the pretrained model, not copied: the weights stay the model's.
        self.up, self.down = up, down
        if "relu" not in self.spec.activations:  # softmax-only kernels (SDPA, Performer) cannot be an FF
            raise UnsupportedAtFeedForward(f"{impl} supports only softmax: it cannot compute a feed-forward layer")
        if activation == "relu":
            d_model = up.in_features
            self.attention = self.spec.module(d_model + 1, **self.options)
        elif not self.spec.exact and "topk" not in self.options:
            raise UnsupportedAtFeedForward(
                f"{impl} has no GELU feed-forward form (only exact and top-k implementations do)"
            )

    def _keys(self) -> torch.Tensor:
        return torch.cat([self.up.weight, self.up.bias[:, None]], dim=1)  # [d_ff, d_model + 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        queries = torch.cat([tokens, tokens.new_ones(tokens.shape[0], 1)], dim=1)
        values = self.down.weight.t()  # [d_ff, d_model]
        if self.activation == "relu":
            out = self.attention(
                queries[None, None], self._keys()[None, None], values[None, None], causal=False, activation="relu"
            )[0, 0]
        else:
            out = self._gelu(queries, values)
        return (out + self.down.bias).reshape(shape)

    def _gelu(self, queries: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        keys = self._keys()
        chunk = int(self.options.get("chunk_size") or queries.shape[0])
        topk = self.options.get("topk")
        outs = []
        # One query chunk at a time, as the chunked implementations do: at most chunk x d_ff scores live.
        for start in range(0, queries.shape[0], chunk):
            scores = queries[start : start + chunk] @ keys.t()
            if topk is not None and topk < keys.shape[0]:
                top, index = scores.topk(int(topk), dim=-1)
                # sum_j GELU(z_j) W2ᵀ[j] over the kept keys only: scattered into the (dead) score
                # buffer, as the registry's dense top-k does, rather than gathering k value rows per token.
                outs.append(scores.zero_().scatter_(-1, index, F.gelu(top)) @ values)
            else:
                outs.append(F.gelu(scores) @ values)
        return torch.cat(outs)
