"""Attention shapes of real models: the values of the ``model`` parameter of the prefill and decode workloads.

Each sets ``q_heads``, ``kv_heads`` and ``head_dim`` as the model's published
configuration does (Hugging Face ``config.json``: ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` or ``hidden_size / num_attention_heads``).
``custom`` sets nothing: the suite gives the three itself.
"""

from __future__ import annotations

CUSTOM = "custom"

MODELS: dict[str, dict[str, int]] = {
    "llama-3-8b": {"q_heads": 32, "kv_heads": 8, "head_dim": 128},  # grouped-query: 4 query heads per K/V head
    "gemma-2b": {"q_heads": 8, "kv_heads": 1, "head_dim": 256},  # multi-query: one K/V head
    "bert-base": {"q_heads": 12, "kv_heads": 12, "head_dim": 64},  # multi-head: the paper's shape
    CUSTOM: {},
}
