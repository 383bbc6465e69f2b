"""Fidelity columns of a ``pretrained`` case: its sentence embeddings against the original model's.

``emb_cos``: mean cosine between a text's embedding and the original's;
``nn_agree``: share of texts whose nearest neighbour in the corpus is unchanged;
``nn_spearman``: mean rank correlation of each text's similarities to all others.
The reference is the unmodified model through its own (transformers) code path.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from scipy.stats import spearmanr

from topk_bench.case import Case
from topk_bench.results import columns as col
from topk_bench.workloads.pretrained import model as pretrained
from topk_bench.workloads.pretrained.encoder import corpus_ids, corpus_key, plugged, settings


@lru_cache(maxsize=4)
def reference(key: tuple[int, int, int]) -> torch.Tensor:
    """The original model's embeddings of the corpus selected by ``key`` (see ``corpus_key``)."""
    _, bert = pretrained.load_model()
    with torch.no_grad():
        return pretrained.encode(pretrained.original(bert), corpus_ids(*key))


def emb_cos(emb: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean over rows of the cosine similarity between ``emb[i]`` and ``ref[i]`` (``[N, dim]``)."""
    emb, ref = emb.detach().double(), ref.detach().double()
    return float(torch.nn.functional.cosine_similarity(emb, ref, dim=-1).mean())


def _similarities(emb: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every pair of rows, the diagonal (a text with itself) set to -inf."""
    unit = torch.nn.functional.normalize(emb.detach().double(), dim=-1)
    sims = unit @ unit.t()
    return sims.fill_diagonal_(-math.inf)


def nn_agree(emb: torch.Tensor, ref: torch.Tensor) -> float:
    """Share of texts whose nearest neighbour in the corpus (by cosine) is the same under ``emb`` and ``ref``."""
    if emb.shape[0] < 2:
        raise ValueError("nearest neighbours need at least two texts")
    return float((_similarities(emb).argmax(-1) == _similarities(ref).argmax(-1)).double().mean())


def nn_spearman(emb: torch.Tensor, ref: torch.Tensor) -> float:
    """Retrieval rank agreement: Spearman correlation between each text's similarities to all others
    under ``emb`` and under ``ref``, averaged over texts (1.0: every ranking of the corpus is kept)."""
    if emb.shape[0] < 3:
        raise ValueError("a rank correlation needs at least three texts")
    sims, ref_sims = _similarities(emb), _similarities(ref)
    n = sims.shape[0]
    off_diagonal = ~torch.eye(n, dtype=torch.bool)
    rhos = []
    for i in range(n):
        rho = spearmanr(sims[i][off_diagonal[i]].numpy(), ref_sims[i][off_diagonal[i]].numpy()).statistic
        rhos.append(0.0 if math.isnan(rho) else float(rho))  # nan: a constant row, no ranking to agree on
    return sum(rhos) / n


def compare(emb: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    return {col.EMB_COS: emb_cos(emb, ref), col.NN_AGREE: nn_agree(emb, ref), col.NN_SPEARMAN: nn_spearman(emb, ref)}


def columns(case: Case) -> dict[str, float]:
    """The case's ``emb_cos``, ``nn_agree`` and ``nn_spearman``."""
    params, _, _ = settings(case)
    key = corpus_key(params)
    with torch.no_grad():
        emb = plugged(case)(*corpus_ids(*key))
    return compare(emb, reference(key))
