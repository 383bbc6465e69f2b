"""Attention implementations measured by topk-bench: plain PyTorch, importable without the harness.

>>> import implementations
>>> attn = implementations.get("vanilla")
>>> out = attn(q, k, v, causal=True, activation="softmax")
"""

# Importing a module registers its implementations.
from implementations import (  # noqa: F401 -- to register
    block_topk,
    dsa,
    flex,
    nsa,
    page_topk,
    paper,
    performer,
    qchunk,
    sdpa,
    sink_window,
    topk,
    topk_fast,
    topk_sparse,
    vanilla,
)
from implementations.layers import Decoder, FeedForward, MultiHeadAttention
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

__all__ = [
    "ACTIVATIONS",
    "Implementation",
    "UnknownImplementation",
    "all_specs",
    "get",
    "names",
    "register",
    "spec",
    "MultiHeadAttention",
    "FeedForward",
    "Decoder",
]
