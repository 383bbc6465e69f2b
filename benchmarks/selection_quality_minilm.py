"""Selection quality on real activations: the pretrained MiniLM's queries and keys, against random inputs.

For each of all-MiniLM-L6-v2's 6 layers, the queries, keys and values its own forward
computes (12 heads, head_dim 32) on the shipped corpus, concatenated up to 512 tokens
(:func:`extract_activations`), and random inputs of the same shape (q ~ N(0, 1)/sqrt(d),
k, v ~ N(0, 1)). Methods at budgets 1/16, 1/8 and 1/4 of the keys:

* ``page_topk`` (Quest): ``page_size`` 8, ``token_budget`` = budget (plus the own page);
* ``sink_window`` (StreamingLLM): 4 sinks + a window of budget - 4;
* ``topk``: the exact top-k, k = budget;
* ``block_topk`` (MoBA) with ``--with-block-topk``: blocks of 8, ``budget // 8`` blocks (plus the own one).

Metrics (``topk_bench.extras.quality``): ``mass_recall`` (exact softmax mass on the
attended keys), ``topk_recall`` (share of the exact top-k attended, k = the method's own
count) and ``rel_err`` (relative Frobenius error of the output), averaged over rows,
heads and layers; ``keys`` is the mean number of keys attended per row. MiniLM is a
bidirectional encoder, so the default is ``causal=False`` (its own attention);
``--causal`` evaluates the same activations with a causal mask (as in decoding).

    python benchmarks/selection_quality_minilm.py            # both inputs, non-causal
    python benchmarks/selection_quality_minilm.py --causal
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import topk_bench.attention
from topk_bench.extras.quality import selection_quality
from topk_bench.workloads.pretrained import activations

BUDGETS = (16, 8, 4)  # budget = keys // BUDGET


extract_activations = activations.extract
corpus_text = activations.corpus_text


def random_like(layers: list[dict[str, torch.Tensor]], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for acts in layers:
        d = acts["q"].shape[-1]
        out.append(
            {
                "q": torch.randn(acts["q"].shape, generator=g) / math.sqrt(d),
                "k": torch.randn(acts["k"].shape, generator=g),
                "v": torch.randn(acts["v"].shape, generator=g),
            }
        )
    return out


def methods(length: int, budget: int, with_block_topk: bool):
    """``(label, registry name, options)`` of each method at ``budget`` keys."""
    out = [
        ("page_topk", "page_topk", {"page_size": 8, "token_budget": budget}),
        ("sink_window", "sink_window", {"sinks": 4, "window": budget - 4}),
        ("topk", "topk_fast", {"topk": budget}),
    ]
    if with_block_topk:
        out.append(("block_topk", "block_topk", {"block_size": 8, "topk_blocks": budget // 8}))
    return out


def evaluate(layers, causal: bool, with_block_topk: bool) -> dict:
    """``{(method, budget): {metric: mean over layers}}`` plus the per-layer ``mass_recall``."""
    length = layers[0]["k"].shape[2]
    rows = {}
    for denom in BUDGETS:
        budget = length // denom
        for label, name, options in methods(length, budget, with_block_topk):
            spec = topk_bench.attention.spec(name)
            per_layer = []
            for acts in layers:
                q, k, v = acts["q"], acts["k"], acts["v"]
                selected = spec.selection(q, k, causal=causal, **options)
                out = spec.fn(q, k, v, causal=causal, **options)
                metrics = selection_quality(q, k, v, selected, out, causal=causal)
                metrics["keys"] = float(selected.sum(-1).double().mean())
                per_layer.append(metrics)
            mean = {m: sum(p[m] for p in per_layer) / len(per_layer) for m in per_layer[0]}
            mean["layers_mass"] = [p["mass_recall"] for p in per_layer]
            rows[(label, denom)] = mean
    return rows


def print_table(title: str, rows: dict) -> None:
    print(f"\n{title}")
    print(
        f"{'method':<12} {'budget':>7} {'keys':>7} {'mass_recall':>12} {'topk_recall':>12} {'rel_err':>9}"
        "   mass_recall per layer"
    )
    for (label, denom), m in rows.items():
        layers = " ".join(f"{x:.3f}" for x in m["layers_mass"])
        print(
            f"{label:<12} {'1/' + str(denom):>7} {m['keys']:7.1f} {m['mass_recall']:12.4f} {m['topk_recall']:12.4f} "
            f"{m['rel_err']:9.4f}   {layers}"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--causal", action="store_true", help="evaluate with a causal mask (default: bidirectional)")
    parser.add_argument("--with-block-topk", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    real = extract_activations(corpus_text(), args.max_tokens)
    shape = tuple(real[0]["q"].shape)
    print(
        f"MiniLM activations: {len(real)} layers, q/k/v {shape} (q scaled by 1/sqrt(d)), "
        f"causal={args.causal}, torch {torch.__version__}"
    )
    for kind, layers in (("MiniLM (real activations)", real), ("random N(0,1) inputs, same shape", random_like(real))):
        print_table(f"{kind}, L={shape[2]}", evaluate(layers, args.causal, args.with_block_topk))
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
