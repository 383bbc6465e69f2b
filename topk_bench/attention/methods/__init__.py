"""The attention methods, one module each: importing one registers its implementations."""

from topk_bench.attention.methods import (  # noqa: F401 -- to register
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
