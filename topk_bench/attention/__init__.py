"""Attention implementations measured by topk-bench: plain PyTorch (and its own kernels), importable without the
harness: nothing here imports the rest of ``topk_bench``.

>>> from topk_bench import attention
>>> attn = attention.get("vanilla")
>>> out = attn(q, k, v, causal=True, activation="softmax")

- ``registry``: what an implementation is and the names it is registered under (plug-ins register here);
- ``methods/``: the methods, one module each; importing one registers it;
- ``shared/``: what the methods share (masks, selection, block-sparse attention, the decode path, stages,
  devices);
- ``kernels/``: the backends of their hot loops, ``native/`` (C, compiled on first use) and ``triton/``;
- ``layers``: the modules the workloads build (multi-head attention, feed-forward, the decoder);
- ``provenance``: which code path a call takes on a device (the rows' ``code_path``).
"""

from topk_bench.attention import methods  # noqa: F401 -- importing it registers every method
from topk_bench.attention.layers import Decoder, FeedForward, MultiHeadAttention
from topk_bench.attention.registry import (
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
