"""Eager against ``compile = true``, interleaved in one process: one decode step's attention at kv_targets' point.

    python benchmarks/harness/bench_compile_ab.py [--impl page_topk] [--kv-len 131072] [--pairs 20] [--mode default]

Builds the decode workload of ``suites/compile.toml`` (Llama-3-8B's attention, bf16, a 1/16 token budget),
then times one step of the implementation's attention eagerly and through ``torch.compile`` (its module
compiled as the harness compiles it, ``topk_bench.measure.compiled``) in alternating pairs, the order
swapped every other pair: load that drifts over seconds falls on both alike, which separate child
processes (the suite's rounds) minutes apart cannot promise. Prints the medians, the ratio of medians and
the median and quartiles of the per-pair ratios, with the CPU's kind and the load it ran under.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's topk_bench, not an installed one

from topk_bench import workloads
from topk_bench.case import Case
from topk_bench.measure import metadata
from topk_bench.workloads.attention import with_budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="page_topk")
    parser.add_argument("--kv-len", type=int, default=131072)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--mode", default="default", help="torch.compile's mode")
    args = parser.parse_args()
    options = {"page_size": 16} if args.impl == "page_topk" else {}
    case = Case.make(
        suite="ab",
        workload="decode",
        impl=args.impl,
        dtype="bfloat16",
        mode="fwd",
        causal=True,
        params={"model": "llama-3-8b", "kv_len": args.kv_len, "budget": args.kv_len // 16},
        options=with_budget(args.impl, options, args.kv_len // 16),
    )
    torch.manual_seed(0)
    wl = workloads.build(case, "cpu", torch.bfloat16)
    eager = wl.model.layer.attention
    compiled = workloads.build(case, "cpu", torch.bfloat16).model.layer.attention  # its own module, same options
    compiled.compile(mode=None if args.mode == "default" else args.mode)
    q, k_new, v_new, k_cache, v_cache = wl.inputs

    def step(attention) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            k_cache[..., -k_new.shape[-2] :, :].copy_(k_new)
            v_cache[..., -v_new.shape[-2] :, :].copy_(v_new)
            attention(q, k_cache, v_cache, causal=True, activation="softmax")
        return time.perf_counter() - start

    first = step(compiled)
    for _ in range(2):
        step(eager), step(compiled)
    load = os.getloadavg()[0]
    pairs = []
    for i in range(args.pairs):
        if i % 2:
            c, e = step(compiled), step(eager)
        else:
            e, c = step(eager), step(compiled)
        pairs.append((e, c))
    ratios = [c / e for e, c in pairs]
    e_med, c_med = statistics.median(e for e, _ in pairs), statistics.median(c for _, c in pairs)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    print(f"{args.impl}, kv_len {args.kv_len}, bf16, compile mode {args.mode}: first compiled call {first:.1f} s")
    print(
        f"eager median {e_med:.3f} s, compiled median {c_med:.3f} s: ratio of medians {c_med / e_med:.3f}; "
        f"per-pair ratio median {statistics.median(ratios):.3f} (quartiles {q1:.3f} to {q3:.3f}), {args.pairs} pairs"
    )
    print(
        f"CPU {metadata.cpu_model()}, ATen {metadata.cpu_capability()}, bf16/AMX flags {metadata.cpu_flags()}, "
        f"{torch.get_num_threads()} threads, 1-minute load {load:.2f} then {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
