"""DSA (topk_bench/attention/methods/dsa.py) against its naive float64 oracle
(tests/attention_reference.reference_dsa): the
largest relative error of the output, of the q/k/v gradients and, with the indexer loss, of the loss and of the
indexer weights' gradients, per configuration (odd lengths, causal, grouped-query heads, topk >= keys).

Relative error: ``max |got - want| / max |want|`` per tensor. Prints a Markdown table.

    .venv/bin/python scripts/dsa_agreement.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from attention_reference import qkv_gqa, reference_dsa
from topk_bench.attention.methods.dsa import dsa_attention, indexer_weights

D, HEADS, DIM, LOSS = 5, 16, 4, 0.7
CONFIGS = [
    # (Lq, Lk, Hq, Hkv, causal, topk)
    (7, 7, 2, 2, False, 3),
    (7, 7, 2, 2, True, 3),
    (5, 9, 6, 3, True, 3),
    (1, 9, 6, 3, True, 4),
    (9, 4, 4, 1, True, 3),
    (9, 4, 4, 1, False, 100),
    (11, 13, 6, 2, True, 100),
]
NAMES = ("out", "dq", "dk", "dv", "loss", "dwq", "dwk", "dww")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale else 1.0)


def row(lq, lk, hq, hkv, causal, topk) -> list[float]:
    q, k, v = qkv_gqa(lq, lk, hq, hkv, d=D, dv=4, b=2, seed=lq * 31 + lk)
    w = tuple(x.double().requires_grad_() for x in indexer_weights(D, HEADS, DIM, 1))
    losses: list[torch.Tensor] = []
    got = dsa_attention(
        q,
        k,
        v,
        causal=causal,
        topk=topk,
        indexer=w,
        chunk_size=3,
        index_heads=HEADS,
        index_head_dim=DIM,
        indexer_loss=LOSS,
        loss_out=losses,
    )
    want, want_loss = reference_dsa(q, k, v, *w, topk=topk, causal=causal)
    g = torch.linspace(-1, 1, want.numel(), dtype=want.dtype).reshape(want.shape)
    got_grads = torch.autograd.grad(got, (q, k, v, *w), g)
    want_grads = torch.autograd.grad((want * g).sum() + LOSS * want_loss, (q, k, v, *w))
    pairs = [(got, want), *zip(got_grads[:3], want_grads[:3]), (losses[0], want_loss.detach())]
    pairs += list(zip(got_grads[3:], want_grads[3:]))
    return [rel(a.detach(), b.detach()) for a, b in pairs]


def main() -> None:
    torch.set_num_threads(1)
    print("| Lq | Lk | Hq/Hkv | causal | topk | " + " | ".join(NAMES) + " |")
    print("|" + "---|" * (5 + len(NAMES)))
    worst = [0.0] * len(NAMES)
    for config in CONFIGS:
        lq, lk, hq, hkv, causal, topk = config
        errors = row(*config)
        worst = [max(a, b) for a, b in zip(worst, errors)]
        cells = " | ".join(f"{e:.1e}" for e in errors)
        print(f"| {lq} | {lk} | {hq}/{hkv} | {causal} | {topk} | {cells} |")
    print("| worst | | | | | " + " | ".join(f"{e:.1e}" for e in worst) + " |")


if __name__ == "__main__":
    main()
