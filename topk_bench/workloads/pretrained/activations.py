"""Real attention inputs: the queries, keys and values of the pretrained MiniLM's layers over the shipped corpus.

For the selection-quality columns (``quality = ["minilm"]``): each of all-MiniLM-L6-v2's
6 layers' q, k, v (12 heads of 32) as its own unmodified forward computes them, on
the corpus's sentences joined into one text up to the model's 512 tokens. Captured by
hooks on the query/key/value projections; ``q`` is scaled by ``1/sqrt(head_dim)``
(the registry's convention). Offline: the weights ship with the package.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from topk_bench.workloads.pretrained import model as pretrained
from topk_bench.workloads.pretrained.corpus import load_corpus


def corpus_text() -> str:
    """The shipped corpus as one text (its sentences in order); the tokenizer truncates it."""
    return " ".join(load_corpus())


def extract(text: str, max_tokens: int = pretrained.MAX_TOKENS, model=None) -> list[dict[str, torch.Tensor]]:
    """Per layer, ``{"q", "k", "v"}`` ``[1, heads, L, head_dim]`` of the MiniLM on ``text`` (at most ``max_tokens``).

    ``model``: ``(tokenizer, bert)`` (default ``pretrained.load_model()``, offline).
    """
    tokenizer, bert = model or pretrained.load_model()
    ids = pretrained.tokenize(tokenizer, [text], max_tokens)[0].unsqueeze(0)
    heads = bert.config.num_attention_heads
    head_dim = bert.config.hidden_size // heads
    captured: list[dict[str, torch.Tensor]] = [{} for _ in bert.encoder.layer]

    def hook(index, name):
        def save(module, inputs, output):
            x = output.detach().view(1, -1, heads, head_dim).transpose(1, 2).contiguous()
            captured[index][name] = x / math.sqrt(head_dim) if name == "q" else x

        return save

    handles = []
    for index, layer in enumerate(bert.encoder.layer):
        own = layer.attention.self
        for name, module in (("q", own.query), ("k", own.key), ("v", own.value)):
            handles.append(module.register_forward_hook(hook(index, name)))
    try:
        with torch.no_grad():
            bert(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    return captured


@lru_cache(maxsize=1)
def corpus_activations() -> tuple[dict[str, torch.Tensor], ...]:
    """:func:`extract` on :func:`corpus_text`, once per process."""
    return tuple(extract(corpus_text()))
