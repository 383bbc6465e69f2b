"""Attention implementations measured by topk-bench: plain PyTorch, importable without the harness.

>>> import implementations
>>> attn = implementations.get("vanilla")
>>> out = attn(q, k, v, causal=True, activation="softmax")
"""

from implementations.registry import (
    ACTIVATIONS,
    Implementation,
    UnknownImplementation,
    all_specs,
    get,
    names,
    register,
    spec,
)

# Importing a module registers its implementations.
from implementations import vanilla, sdpa, qchunk, topk, topk_sparse, performer, topk_fast  # noqa: E402,F401
from implementations import paper  # noqa: E402,F401  (vanilla_paper, qchunk_paper, topk_paper)
from implementations import page_topk, sink_window, block_topk, flex  # noqa: E402,F401  (KV-cache and block selection)

from implementations.layers import Decoder, FeedForward, MultiHeadAttention  # noqa: E402

__all__ = [
    "ACTIVATIONS", "Implementation", "UnknownImplementation", "all_specs", "get", "names",
    "register", "spec", "MultiHeadAttention", "FeedForward", "Decoder",
]
