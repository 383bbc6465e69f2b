"""PyTorch's fused ``scaled_dot_product_attention``: what users pick today."""

from __future__ import annotations

import torch.nn.functional as F

from implementations.masking import check_activation
from implementations.registry import Implementation, register


def sdpa_attention(q, k, v, *, causal=False, activation="softmax"):
    check_activation(activation)
    if activation != "softmax":
        raise ValueError("sdpa supports only activation='softmax'")
    # The caller has already scaled q (paper convention), hence scale=1.
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)


SDPA = register(
    Implementation(
        name="sdpa",
        fn=sdpa_attention,
        description="torch.nn.functional.scaled_dot_product_attention (fused kernels)",
        label="PyTorch SDPA",
        activations=("softmax",),
    )
)
