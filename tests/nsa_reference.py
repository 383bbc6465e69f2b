"""A float64 oracle of Native Sparse Attention (Yuan et al., 2025), written from the paper, not from
``implementations.nsa``: one query at a time, every branch from its definition.

- compression block ``t`` covers keys ``t*d .. t*d + l - 1`` (whole blocks only), its key and value the mean of
  the block's; a query at position ``p`` sees the blocks that end at or before ``p`` (causal);
- selection block ``j`` covers keys ``j*l' .. (j+1)*l' - 1``; its score is the sum, over the query heads of the
  K/V group, of the compression probabilities of every compression block whose keys overlap it; the query
  attends the initial block, its own block and the one before, then the best-scoring others up to ``n`` blocks;
- window: keys ``p - w < j <= p``;
- out = sigmoid gates (q @ W + b, or 1/3) times the three branch outputs, summed.
"""

from __future__ import annotations

import torch


def _attend(qi, keys, values):
    """Softmax attention of one query over ``keys [m, d]``; zeros when there is none."""
    if keys.shape[0] == 0:
        return torch.zeros(values.shape[-1], dtype=qi.dtype)
    return torch.softmax(keys @ qi, dim=0) @ values


def nsa_reference(q, k, v, *, causal, l, d, l_sel, n, w, gate_weight=None, gate_bias=None):  # noqa: E741 -- the paper's names
    b_, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    nc = (lk - l) // d + 1 if lk >= l else 0
    ns = -(-lk // l_sel)
    rows = []
    for b in range(b_):
        heads = []
        for h in range(hq):
            kv = h // g
            kc = [k[b, kv, t * d : t * d + l].mean(dim=0) for t in range(nc)]
            vc = [v[b, kv, t * d : t * d + l].mean(dim=0) for t in range(nc)]
            outs = []
            for i in range(lq):
                p = lk - lq + i
                qi = q[b, h, i]
                seen = [t for t in range(nc) if not causal or t * d + l - 1 <= p]
                o_cmp = _attend(
                    qi,
                    torch.stack([kc[t] for t in seen]) if seen else k.new_zeros(0, k.shape[-1]),
                    torch.stack([vc[t] for t in seen]) if seen else v.new_zeros(0, v.shape[-1]),
                )
                # The group's importance of each selection block (no gradient: a top-n).
                score = [0.0] * ns
                with torch.no_grad():
                    for member in range(kv * g, (kv + 1) * g):
                        if not seen:
                            break
                        logits = torch.stack([q[b, member, i] @ kc[t] for t in seen])
                        probs = torch.softmax(logits, dim=0)
                        for t, prob in zip(seen, probs.tolist()):
                            for j in range(ns):
                                if t * d < (j + 1) * l_sel and t * d + l > j * l_sel:
                                    score[j] += prob
                if p < 0 and causal:
                    chosen = []
                else:
                    own = max(p, 0) // l_sel
                    eligible = [j for j in range(ns) if not causal or j <= own]
                    fixed = {0, own, own - 1}
                    ranked = sorted(eligible, key=lambda j: (j not in fixed, -score[j]))
                    chosen = ranked[:n]
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
