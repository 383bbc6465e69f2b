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
from implementations import vanilla, sdpa, qchunk, topk, topk_sparse, performer, topk_fast  # noqa: F401 -- to register
from implementations import paper  # noqa: F401 -- registers vanilla_paper, qchunk_paper, topk_paper
from implementations import page_topk, sink_window, block_topk, flex  # noqa: F401 -- to register

from implementations.layers import Decoder, FeedForward, MultiHeadAttention

__all__ = [
    "ACTIVATIONS", "Implementation", "UnknownImplementation", "all_specs", "get", "names",
    "register", "spec", "MultiHeadAttention", "FeedForward", "Decoder",
]
