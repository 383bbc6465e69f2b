"""The CUDA kernel allocation rules, one module per family of kernels; importing this package registers them."""

from topk_bench.predict.kernels.rules import (  # noqa: F401 -- registers the rules
    attention,
    blas,
    embedding_bag,
    normalization,
    selection,
    softmax,
)
