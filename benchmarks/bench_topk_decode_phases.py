"""Where a top-k decode step spends its time: the phases of ``topk_fast``'s decode path, timed apart.

One decode step of Llama-3-8B's attention (32 query heads on 8 K/V heads of 128), bfloat16,
batch 1, over ``--kv-len`` cached tokens, keeping ``--topk`` keys per query: the score product
over every key (float32 ranking: keys converted tile by tile; bf16 ranking, the default: one
bf16 GEMM), then on the default's bf16 scores the pruned exact top-k (run maxima, top-k of
runs, their members, top-k of members, all on the scores' int16 bits, converted once; on CPU
topk_fast runs the compiled row top-k of :mod:`topk_bench.attention.kernels.native` on the bf16 scores instead, timed
beside), the
softmax and the bag of the chosen V rows; beside them, dense attention's second product
(weights @ V over every key), which is what a top-k step saves; then whole steps of
``topk_fast`` (both rankings), vanilla and SDPA (the registry's entries). Medians of ``--rounds``
calls of each phase, after one untimed; ``uptime`` before and after.

    python benchmarks/bench_topk_decode_phases.py --kv-len 131072 --topk 8192 --rounds 11
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

import topk_bench.attention
from topk_bench.attention.kernels import native
from topk_bench.attention.methods.topk_fast import _ordered_bits, _segments
from topk_bench.attention.shared import decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-len", type=int, default=131072)
    parser.add_argument("--topk", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    torch.manual_seed(0)
    q = torch.randn(1, 32, 1, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, args.kv_len, 128, dtype=torch.bfloat16) for _ in range(2))
    kk, s = args.topk, _segments(args.kv_len, args.topk)
    times: dict[str, list[float]] = {}

    def timed(name, fn):
        fn()
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            out = fn()
            times.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    with torch.no_grad():
        for ranking, float_scores in (("float32", True), ("bf16", False)):
            timed(
                f"scores ({ranking} ranking)",
                lambda float_scores=float_scores: decode.decode_scores(
                    q, k, 4, causal=True, multiple=s, float_scores=float_scores
                ),
            )
        scores = decode.decode_scores(q, k, 4, causal=True, multiple=s, float_scores=False)
        rows, width = scores.shape[-2:]
        ranks = timed("scores to their int16 bits", lambda: _ordered_bits(scores))
        runs = ranks.view(-1, s)
        maxima = timed("run maxima", lambda: runs.amax(dim=-1))
        best = timed("top-k of runs", lambda: maxima.view(-1, rows, width // s).topk(kk, dim=-1, sorted=False).indices)
        first = torch.arange(0, best.shape[0] * rows * (width // s), width // s).view(best.shape[0], rows, 1)
        members = timed("their members", lambda: runs.index_select(0, (best + first).view(-1)))
        top, pos = timed(
            "top-k of members", lambda: members.view(*best.shape[:-1], kk * s).topk(kk, dim=-1, sorted=False)
        )
        where = best.gather(-1, torch.div(pos, s, rounding_mode="floor")) * s + pos % s
        if native.available(scores.dtype):  # what topk_fast runs on CPU instead of the five phases above
            out = (scores.new_empty(best.shape), torch.empty(best.shape, dtype=torch.int64))
            timed(
                "compiled row top-k of the bf16 scores (replaces the 5 above)",
                lambda: native.row_topk_(
                    scores.view(-1, rows, width), kk, out[0].view(-1, rows, kk), out[1].view(-1, rows, kk)
                ),
            )
        weights = timed("softmax", lambda: torch.softmax(_ordered_bits(top).view(scores.dtype).float(), dim=-1))
        timed("bag of the chosen V rows", lambda: decode.decode_output(weights, where, q, v))
        dense_weights = torch.softmax(scores.float(), dim=-1).to(torch.bfloat16).view(8, 4, -1)[..., : args.kv_len]
        timed("dense: weights @ V (all keys)", lambda: dense_weights @ v.view(8, args.kv_len, 128))
        for ranking, float_scores in (("float32", True), ("bf16", False)):
            timed(
                f"whole step, topk_fast ({ranking} ranking)",
                lambda float_scores=float_scores: topk_bench.attention.get("topk_fast")(
                    q, k, v, causal=True, topk=kk, float_scores=float_scores
                ),
            )
        for name in ("vanilla", "sdpa"):
            timed(f"whole step, {name}", lambda name=name: topk_bench.attention.get(name)(q, k, v, causal=True))
    for name, samples in times.items():
        print(f"{name:60s} {statistics.median(samples) * 1e3:8.1f} ms")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
