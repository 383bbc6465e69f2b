"""Approximation quality: pure metrics comparing an output (or embeddings) with vanilla's.

Everything here takes tensors and returns floats; what is compared with what
is decided by :mod:`topk_bench.fidelity_case` (layers against vanilla) and
:mod:`topk_bench.pretrained_eval` (sentence embeddings against the original model).
"""

from __future__ import annotations

import math

import torch
from scipy.stats import spearmanr


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ``||out - ref|| / ||ref||`` (computed in float64)."""
    out, ref = out.detach().double(), ref.detach().double()
    norm = torch.linalg.vector_norm(ref)
    diff = torch.linalg.vector_norm(out - ref)
    if norm == 0:
        return 0.0 if diff == 0 else math.inf
    return float(diff / norm)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors seen as flat vectors (1.0 when both are zero)."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    na, nb = torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def grad_cos(grad: torch.Tensor, ref_grad: torch.Tensor) -> float:
    """Cosine similarity of input gradients: does backward point the same way as vanilla's?"""
    return cosine(grad, ref_grad)


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
