"""Fidelity columns of a ``pretrained`` case: its sentence embeddings against the original model's.

``emb_cos``: mean cosine between a text's embedding and the original's;
``nn_agree``: share of texts whose nearest neighbour in the corpus is unchanged;
``nn_spearman``: mean rank correlation of each text's similarities to all others.
The reference is the unmodified model through its own (transformers) code path.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from topk_bench import fidelity, pretrained
from topk_bench.case import Case
from topk_bench.pretrained_workload import corpus_ids, corpus_key, plugged, settings


@lru_cache(maxsize=4)
def reference(key: tuple[int, int, int]) -> torch.Tensor:
    """The original model's embeddings of the corpus selected by ``key`` (see ``corpus_key``)."""
    _, bert = pretrained.load_model()
    with torch.no_grad():
        return pretrained.encode(pretrained.original(bert), corpus_ids(*key))


def compare(emb: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    return {
        "emb_cos": fidelity.emb_cos(emb, ref),
        "nn_agree": fidelity.nn_agree(emb, ref),
        "nn_spearman": fidelity.nn_spearman(emb, ref),
    }


def columns(case: Case) -> dict[str, float]:
    """The case's ``emb_cos``, ``nn_agree`` and ``nn_spearman``."""
    params, _, _ = settings(case)
    key = corpus_key(params)
    with torch.no_grad():
        emb = plugged(case)(*corpus_ids(*key))
    return compare(emb, reference(key))
