"""How well a selection method chooses its keys: pure functions, tensors in, floats out.

A selection method attends each query to a subset of the keys its causal mask
allows (``selected``, bool ``[..., Lq, Lk]``, from an entry's ``selection``
function). Against the exact scores ``q · k`` (``scores``, same shape) and the keys
each query may see (``allowed``, broadcastable bool, None = all):

* :func:`topk_recall`: the share of the exact top-k keys by score that the method
  attends, with ``k`` its own budget in that row (the number of keys it selected),
  averaged over rows;
* :func:`mass_recall`: the exact softmax probability mass (over the allowed keys)
  that falls on the attended keys, averaged over rows;
* :func:`rel_err` (fidelity's): the relative Frobenius error of an output against a reference.

Rows where a metric is undefined are left out of its average: rows with no allowed
key (both recalls) and rows where the method selected nothing (top-k recall; its mass
recall is 0). Computed in float64. No harness imports: usable on any tensors.
"""

from __future__ import annotations

import math

import torch

from topk_bench.extras.fidelity import rel_err  # noqa: F401 -- one definition, re-exported


def allowed_mask(lq: int, lk: int, causal: bool, device=None) -> torch.Tensor:
    """Bool ``[Lq, Lk]`` under the bottom-right convention: key ``j`` for query ``i`` iff ``j <= Lk - Lq + i``."""
    if not causal:
        return torch.ones(lq, lk, dtype=torch.bool, device=device)
    return torch.arange(lk, device=device) <= torch.arange(lk - lq, lk, device=device).unsqueeze(1)


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Float64 ``q kᵀ`` per query head, ``[B, Hq, Lq, Lk]``; query head ``h`` reads kv head ``h // (Hq // Hkv)``."""
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    qg = q.detach().double().reshape(b, hkv, (hq // hkv) * lq, d)
    return (qg @ k.detach().double().transpose(-2, -1)).reshape(b, hq, lq, k.shape[2])


def _rows(selected, scores, allowed):
    scores = scores.detach().double()
    if allowed is None:
        allowed = torch.ones_like(scores, dtype=torch.bool)
    allowed = allowed.expand(scores.shape)
    return selected.expand(scores.shape) & allowed, scores, allowed


def _mean(values: torch.Tensor, keep: torch.Tensor) -> float:
    n = int(keep.sum())
    return float(values[keep].sum() / n) if n else math.nan


def topk_rows(selected: torch.Tensor, scores: torch.Tensor, allowed: torch.Tensor | None = None):
    """(per-row top-k recall, rows where it is defined): see :func:`topk_recall`."""
    selected, scores, allowed = _rows(selected, scores, allowed)
    budget = selected.sum(dim=-1)  # k per row
    ranked = scores.masked_fill(~allowed, -math.inf).sort(dim=-1, descending=True).values
    kth = ranked.gather(-1, (budget - 1).clamp(min=0).unsqueeze(-1))  # the k-th largest allowed score
    hits = (selected & (scores >= kth)).sum(dim=-1)
    recall = torch.minimum(hits, budget).double() / budget.clamp(min=1)  # float64: an int ratio is float32
    return recall, (budget > 0) & allowed.any(dim=-1)


def mass_rows(selected: torch.Tensor, scores: torch.Tensor, allowed: torch.Tensor | None = None):
    """(per-row mass recall, rows where it is defined): see :func:`mass_recall`."""
    selected, scores, allowed = _rows(selected, scores, allowed)
    probs = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0)
    return (probs * selected).sum(dim=-1), allowed.any(dim=-1)


def topk_recall(selected: torch.Tensor, scores: torch.Tensor, allowed: torch.Tensor | None = None) -> float:
    """Mean over rows of ``|selected ∩ top-k(scores)| / k`` with ``k`` = keys selected in the row.

    Ties at the k-th score: any tied key counts as a top-k key (the count is capped at k).
    """
    return _mean(*topk_rows(selected, scores, allowed))


def mass_recall(selected: torch.Tensor, scores: torch.Tensor, allowed: torch.Tensor | None = None) -> float:
    """Mean over rows of the exact softmax mass (over allowed keys) on the selected keys."""
    return _mean(*mass_rows(selected, scores, allowed))


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None = None):
    """Float64 softmax attention over the allowed keys (the reference of :func:`rel_err`); GQA as above."""
    scores = attention_scores(q, k)
    if allowed is not None:
        scores = scores.masked_fill(~allowed.expand(scores.shape), -math.inf)
    g = q.shape[1] // k.shape[1]
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v.detach().double().repeat_interleave(g, dim=1)


def selection_quality(q, k, v, selected, out, *, causal: bool) -> dict[str, float]:
    """The quality metrics of one method on one input, by their names in
    :data:`topk_bench.results.columns.QUALITY_METRICS`: ``selected`` its mask (None: not a selection method,
    ``attn_rel_err`` only), ``out`` its output; ``attended_fraction`` is the mean share of its allowed keys a
    query attends.

    Computed one batch element and K/V head at a time (a long cache in float64 would not fit otherwise):
    row means over all rows, ``attn_rel_err`` over the whole output.
    """
    b, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    allowed = allowed_mask(lq, lk, causal, q.device)
    sums = {"mass_recall": [0.0, 0], "topk_recall": [0.0, 0], "attended_fraction": [0.0, 0]}
    num = den = 0.0
    for i in range(b):
        for h in range(hkv):
            heads = slice(h * g, (h + 1) * g)
            qi, ki, vi = q[i : i + 1, heads], k[i : i + 1, h : h + 1], v[i : i + 1, h : h + 1]
            ref = exact_attention(qi, ki, vi, allowed)
            err = out[i : i + 1, heads].detach().double() - ref
            num, den = num + float((err * err).sum()), den + float((ref * ref).sum())
            if selected is None:
                continue
            scores = attention_scores(qi, ki)
            sel = selected[i : i + 1, heads]
            for name, (values, keep) in (
                ("mass_recall", mass_rows(sel, scores, allowed)),
                ("topk_recall", topk_rows(sel, scores, allowed)),
                (
                    "attended_fraction",
                    ((sel & allowed).sum(-1) / allowed.sum(-1).clamp(min=1), allowed.any(-1).expand(sel.shape[:-1])),
                ),
            ):
                sums[name][0] += float(values.double()[keep].sum())
                sums[name][1] += int(keep.sum())
    metrics = {"attn_rel_err": (math.sqrt(num / den) if den else (0.0 if num == 0 else math.inf))}
    if selected is not None:
        metrics.update({name: (total / n if n else math.nan) for name, (total, n) in sums.items()})
    return metrics
