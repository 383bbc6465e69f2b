"""Approximation error of an output: pure metrics comparing a tensor with its exact counterpart.

Everything here takes tensors and returns floats; what is compared with what
is decided by :mod:`topk_bench.extras.columns` (a layer against vanilla).
"""

from __future__ import annotations

import math

import torch


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
