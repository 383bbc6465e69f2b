"""Decode over a long KV cache: selection methods against dense attention, time per step.

Llama-3-8B attention shapes by default (32 query heads, 8 KV heads, head_dim 128,
batch 1, bf16), one new token at the end of a ``--kv-len`` cache, no grad. Token
budget ``--budget`` of the cache (1/16 by default):

* ``page_topk``: Quest, ``page_size`` 16, ``token_budget`` = budget, its page
  summaries built with the cache (outside the timed step, as a server keeps them);
* ``sink_window``: StreamingLLM, 4 sinks + a window of budget - 4 tokens;
* ``topk_fast``: exact top-k attention with k = budget, keys ranked by their bf16
  product (its default); ``topk_fast_f32``: the same ranked by float32 scores;
* dense references: ``einsum`` (two einsums and a float32 softmax, written here),
  ``sdpa`` (the registry's entry: one ``scaled_dot_product_attention`` call with each
  K/V head's query heads folded into its rows; ``enable_gqa=True`` is 10x slower here)
  and ``vanilla``. The dense references and top-k run non-causal: one new token at the
  end sees every key. The reference is the fastest of them.

Implementations are interleaved within each round (the machine is shared, load
drifts); the table gives medians over rounds, ratios of medians to the reference,
the quartiles of the per-round ratio (each against the reference's time in the same
round) and the share of rounds in which a method beat it, and ``uptime``'s load
average before and after.

    python benchmarks/bench_kv_selection.py --kv-len 131072 --rounds 9
    python benchmarks/bench_kv_selection.py --threads 1 --clock cpu --impls sdpa page_topk topk_fast  # busy machine
    python benchmarks/bench_kv_selection.py --impls sdpa page_topk topk_fast --before b86d6d0 --rounds 7

``--before REV`` adds the selection methods asked for (``page_topk``, ``sink_window``, ``topk_fast``) as of a
git revision (its ``topk_bench.attention`` package extracted and imported under another name, its own page
summaries), interleaved in the same rounds: a before/after table in one run.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_topk_fast import load_revision  # beside this file: the script's folder is on sys.path

import topk_bench.attention
from topk_bench.attention.methods.page_topk import page_summaries

DENSE = ("einsum", "sdpa", "vanilla")


def einsum_decode(q, k, v):
    """Dense GQA decode: ``[B, Hkv, G, d]`` queries against their kv head, float32 softmax."""
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, hkv, (hq // hkv) * lq, d)
    scores = torch.einsum("bhqd,bhkd->bhqk", qg, k)
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v).reshape(b, hq, lq, v.shape[-1])


def repeated(spec_name, k, v, groups):
    """K/V as the entry needs them: as they are with native GQA, else repeated per query head."""
    if topk_bench.attention.spec(spec_name).gqa == "native" or groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def build(args):
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    b, hq, hkv, d, lk = args.batch, args.heads, args.kv_heads, args.head_dim, args.kv_len
    q = (torch.randn(b, hq, args.new_tokens, d) / math.sqrt(d)).to(dtype)
    k = torch.randn(b, hkv, lk, d, dtype=dtype)
    v = torch.randn(b, hkv, lk, d, dtype=dtype)
    budget = lk // args.budget
    groups = hq // hkv
    summaries = page_summaries(k, args.page_size)
    steps = {
        "einsum": lambda: einsum_decode(q, k, v),
        "sdpa": lambda: topk_bench.attention.get("sdpa")(q, k, v, causal=False),
        "page_topk": lambda: topk_bench.attention.get("page_topk")(
            q, k, v, causal=True, page_size=args.page_size, token_budget=budget, summaries=summaries
        ),
        "sink_window": lambda: topk_bench.attention.get("sink_window")(
            q, k, v, causal=True, sinks=4, window=budget - 4
        ),
    }
    notes = []
    for label, name, options in (
        ("vanilla", "vanilla", {}),
        ("topk_fast", "topk_fast", {"topk": budget}),
        ("topk_fast_f32", "topk_fast", {"topk": budget, "float_scores": True}),
    ):
        if label not in args.impls:
            continue
        kr, vr = repeated(name, k, v, groups)  # outside the timed step
        steps[label] = functools.partial(topk_bench.attention.get(name), q, kr, vr, causal=False, **options)
        if kr is not k:
            notes.append(f"{name}: no native GQA, K/V repeated x{groups} before timing")
    cache = 2 * k.numel() * k.element_size()
    summary_bytes = summaries.numel() * summaries.element_size()
    # The G query heads of a kv head share its pages (group_pages, the default): one budget per kv head.
    picked = 2 * b * hkv * args.new_tokens * (budget + args.page_size) * d * k.element_size()
    notes = [
        f"token budget {budget} (1/{args.budget} of {lk}); K+V cache {cache / 2**20:.0f} MiB; page_topk reads "
        f"its summaries {summary_bytes / 2**20:.0f} MiB ({summaries.dtype}) + at most "
        f"{picked / 2**20:.0f} MiB of K/V rows (pages shared by the {groups} query heads of a kv head): "
        f"{(summary_bytes + picked) / cache:.2f} of the cache"
    ] + notes
    order = list(args.impls)
    if args.before:  # the selection methods as of another revision, each right after today's
        old = load_revision(args.before)
        old_summaries = importlib.import_module(f"{old.__name__}.page_topk").page_summaries(k, args.page_size)
        native_gqa = getattr(old.spec("topk_fast"), "gqa", "") == "native" or groups == 1
        kf, vf = (k, v) if native_gqa else (k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))
        before = {
            "page_topk": lambda: old.get("page_topk")(
                q, k, v, causal=True, page_size=args.page_size, token_budget=budget, summaries=old_summaries
            ),
            "sink_window": lambda: old.get("sink_window")(q, k, v, causal=True, sinks=4, window=budget - 4),
            "topk_fast": functools.partial(old.get("topk_fast"), q, kf, vf, causal=False, topk=budget),
        }
        for name, step in before.items():
            if name in args.impls:
                steps[f"{name}@{args.before}"] = step
                order.insert(order.index(name) + 1, f"{name}@{args.before}")
    return {n: steps[n] for n in order}, notes


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-len", type=int, default=131072)
    parser.add_argument("--new-tokens", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--budget", type=int, default=16, help="token budget = kv_len // BUDGET")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the process's CPU time (with --threads 1, robust to other processes' load)",
    )
    parser.add_argument(
        "--impls", nargs="+", default=list(DENSE) + ["page_topk", "sink_window", "topk_fast", "topk_fast_f32"]
    )
    parser.add_argument("--before", metavar="REV", help="also run the selection methods as of this git revision")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps, notes = build(args)
    names = list(steps)
    print(
        f"torch {torch.__version__}, {args.threads} threads, B={args.batch} Hq={args.heads} Hkv={args.kv_heads} "
        f"d={args.head_dim} kv_len={args.kv_len} new_tokens={args.new_tokens} {args.dtype}, no grad, "
        f"{args.rounds} interleaved rounds, {args.clock} clock, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    for note in notes:
        print("  " + note)
    print("  before: " + uptime(), flush=True)
    times = {n: [] for n in names}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with torch.no_grad():
        for name in names:  # warm-up: allocator, thread pool, first-call paths
            steps[name]()
        for r in range(args.rounds):
            # Rotate the order so no implementation always runs after the same neighbour.
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = clock()
                steps[name]()
                times[name].append(clock() - start)
            print(f"  round {r + 1}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.1f}" for n in names), flush=True)
    print("  after:  " + uptime())
    med = {n: statistics.median(ts) for n, ts in times.items()}
    dense = [n for n in names if n in DENSE]
    ref = min(dense, key=med.get) if dense else None
    # Per round: each method against the reference's time in that same round.
    per_round = {n: [t / r for t, r in zip(times[n], times[ref])] for n in names} if ref else {}
    print(
        f"\n{'impl':<14} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'/ ' + (ref or '-'):>10} "
        f"{'round ratio q1-q3':>18} {'rounds < 1':>10}"
    )
    for name in names:
        line = f"{name:<14} {med[name] * 1e3:10.2f} {min(times[name]) * 1e3:8.2f} {max(times[name]) * 1e3:8.2f}"
        if ref:
            q1, _, q3 = statistics.quantiles(per_round[name], n=4)
            below = sum(x < 1 for x in per_round[name]) / len(per_round[name])
            line += f" {med[name] / med[ref]:10.3f} {q1:8.3f}-{q3:<9.3f} {below:10.0%}"
        print(line)


if __name__ == "__main__":
    main()
