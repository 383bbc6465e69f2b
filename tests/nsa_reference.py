"""A float64 oracle of Native Sparse Attention (Yuan et al., 2025), written from the paper, not from
``topk_bench.attention.methods.nsa``: one query at a time, every branch from its definition.

- compression block ``i`` covers keys ``i*d .. i*d + l - 1`` (whole blocks only; Eq. 7 counts keys from 1 and
  writes ``k[i*d + 1 : i*d + l]``), its key and value the mean of the block's; a query at position ``p`` sees the
  blocks that end at or before ``p`` (causal), and their softmax probabilities are ``p_cmp`` (Eq. 8);
- selection block ``j`` covers keys ``j*l' .. (j+1)*l' - 1`` (Eq. 12); its importance is Eq. 9's double sum over
  ``p_cmp`` (:func:`eq9_importance`, term by term), summed over the query heads of the K/V group (Eq. 10); the
  query attends the initial block, its own block and the one before, then the best-scoring others up to ``n``;
- window: keys ``p - w < j <= p``;
- out = sigmoid gates (q @ W + b, or 1/3) times the three branch outputs, summed.
"""

from __future__ import annotations

import torch


def eq9_importance(p_cmp, j, *, l, d, l_sel):  # noqa: E741 -- the paper's names
    """Eq. 9: ``p_slc[j] = sum_{m=0}^{l'/d-1} sum_{n=0}^{l/d-1} p_cmp[(l'/d) j - m - n]``, one term at a time.

    ``p_cmp[i]`` is compression block ``i``'s probability (blocks the query does not see are not in the list);
    ``j`` counts selection blocks from 0. Eq. 9's ``[.]`` takes an element of a vector, counted from 1 (the
    first element is block 0 of Eq. 7 and 12): selection block ``j`` is element ``j + 1`` of ``p_slc``, element
    ``e`` of ``p_cmp`` is compression block ``e - 1``. An element the vector does not have adds nothing.
    """
    total = 0.0
    for m in range(l_sel // d):
        for n in range(l // d):
            element = (l_sel // d) * (j + 1) - m - n
            if 1 <= element <= len(p_cmp):
                total += p_cmp[element - 1]
    return total


def _attend(qi, keys, values):
    """Softmax attention of one query over ``keys [m, d]``; zeros when there is none."""
    if keys.shape[0] == 0:
        return torch.zeros(values.shape[-1], dtype=qi.dtype)
    return torch.softmax(keys @ qi, dim=0) @ values


def _compressed(x, l, d):  # noqa: E741 -- the paper's names
    """The compressed keys (values) of one head: the mean of each whole block, ``[nc, d]``."""
    nc = (x.shape[0] - l) // d + 1 if x.shape[0] >= l else 0
    return [x[t * d : t * d + l].mean(dim=0) for t in range(nc)]


def _seen(nc, p, causal, l, d):  # noqa: E741 -- the paper's names
    return [t for t in range(nc) if not causal or t * d + l - 1 <= p]


def _chosen_blocks(q, kc, b, kv, g, i, p, causal, l, d, l_sel, n, lk):  # noqa: E741 -- the paper's names
    """The selection blocks query ``i`` (position ``p``) of K/V head ``kv``'s group attends (no gradient)."""
    if causal and p < 0:
        return []
    ns = -(-lk // l_sel)
    seen = _seen(len(kc), p, causal, l, d)
    score = [0.0] * ns
    with torch.no_grad():
        for member in range(kv * g, (kv + 1) * g):  # Eq. 10: the group's heads' importances, summed
            if not seen:
                break
            p_cmp = torch.softmax(torch.stack([q[b, member, i] @ kc[t] for t in seen]), dim=0).tolist()
            for j in range(ns):
                score[j] += eq9_importance(p_cmp, j, l=l, d=d, l_sel=l_sel)
    own = max(p, 0) // l_sel
    eligible = [j for j in range(ns) if not causal or j <= own]
    fixed = {0, own, own - 1}
    return sorted(eligible, key=lambda j: (j not in fixed, -score[j]))[:n]


def nsa_reference_selection(q, k, *, causal, l, d, l_sel, n, w):  # noqa: E741 -- the paper's names
    """Bool ``[B, Hq, Lq, Lk]``: the keys a query attends one by one (its selected blocks' and its window's)."""
    b_, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    mask = torch.zeros(b_, hq, lq, lk, dtype=torch.bool)
    for b in range(b_):
        for h in range(hq):
            kc = _compressed(k[b, h // g], l, d)
            for i in range(lq):
                p = lk - lq + i
                for j in _chosen_blocks(q, kc, b, h // g, g, i, p, causal, l, d, l_sel, n, lk):
                    mask[b, h, i, j * l_sel : (j + 1) * l_sel] = True
                if causal:
                    mask[b, h, i, max(p + 1, 0) :] = False
                mask[b, h, i, max(p - w + 1, 0) : max(p + 1, 0)] = True
    return mask


def nsa_reference(q, k, v, *, causal, l, d, l_sel, n, w, gate_weight=None, gate_bias=None):  # noqa: E741 -- the paper's names
    b_, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    rows = []
    for b in range(b_):
        heads = []
        for h in range(hq):
            kv = h // g
            kc, vc = _compressed(k[b, kv], l, d), _compressed(v[b, kv], l, d)
            outs = []
            for i in range(lq):
                p = lk - lq + i
                qi = q[b, h, i]
                seen = _seen(len(kc), p, causal, l, d)
                o_cmp = _attend(
                    qi,
                    torch.stack([kc[t] for t in seen]) if seen else k.new_zeros(0, k.shape[-1]),
                    torch.stack([vc[t] for t in seen]) if seen else v.new_zeros(0, v.shape[-1]),
                )
                chosen = _chosen_blocks(q, kc, b, kv, g, i, p, causal, l, d, l_sel, n, lk)
                keys = [j for j in range(lk) if j // l_sel in chosen and (not causal or j <= p)]
                o_slc = _attend(qi, k[b, kv, keys], v[b, kv, keys])
                window = [j for j in range(lk) if p - w < j <= p]
                o_win = _attend(qi, k[b, kv, window], v[b, kv, window])
                if gate_weight is None:
                    gates = [1 / 3, 1 / 3, 1 / 3]
                else:
                    gates = torch.sigmoid(qi @ gate_weight + (0 if gate_bias is None else gate_bias))
                outs.append(gates[0] * o_cmp + gates[1] * o_slc + gates[2] * o_win)
            heads.append(torch.stack(outs))
        rows.append(torch.stack(heads))
    return torch.stack(rows)
