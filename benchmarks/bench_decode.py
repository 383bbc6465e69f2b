"""Decode-step benchmark: a few new query rows against a long KV cache (grouped-query heads).

Llama-3-8B attention shapes by default: 32 query heads, 8 K/V heads, head_dim 128,
batch 1, bfloat16, forward only under ``torch.no_grad()``, causal (bottom-right:
the new tokens sit at the end of the cache). For every cache length and number of
new tokens, the implementations run interleaved within each round (rotating the
order: the machine is shared and load drifts); the table gives medians over rounds
and ratios to the dense reference, the faster (by median) of ``vanilla`` and
``sdpa`` in the same run. ``uptime`` is printed before and after.

Two clocks, both from the same calls: wall time, and the process's CPU time. On a
shared machine the wall time of one call includes whatever the scheduler gave other
processes meanwhile; with one thread the CPU time is the work itself. With more
threads CPU time also counts threads spinning at the end of parallel regions.

One thread by default: on this project's shared 2-core machines, with other processes
running, every parallel region of a 2-thread run can wait a scheduler slice for its
second thread (100 ``fill_`` of 1M floats: 10-20 ms with one thread, 0.3-1.6 s with
two), which measures the op count rather than the work: ``--threads 2`` shows it.

    python benchmarks/bench_decode.py --kv-lens 8192 32768 131072 --new-tokens 1 16 --rounds 7
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import topk_bench.attention

DENSE = ("vanilla", "sdpa")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime unavailable"


def inputs(args, kv_len, new_tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[args.dtype]
    d = args.head_dim
    q = torch.randn(args.batch, args.heads, new_tokens, d, generator=g).div_(math.sqrt(d)).to(dtype)
    k = torch.randn(args.batch, args.kv_heads, kv_len, d, generator=g).to(dtype)
    v = torch.randn(args.batch, args.kv_heads, kv_len, d, generator=g).to(dtype)
    return q, k, v


def options(name, args):
    spec = topk_bench.attention.spec(name)
    return {
        key: value for key, value in {"topk": args.topk, "chunk_size": args.chunk_size}.items() if key in spec.options
    }


def time_step(name, q, k, v, args):
    """(wall seconds, CPU seconds) of one decode step."""
    fn = topk_bench.attention.get(name)
    with torch.no_grad():
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn(q, k, v, causal=not args.non_causal, **options(name, args))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del out
    return wall, cpu


def table(rows, impls, clock):
    print(f"\n{clock} time, median ms")
    header = f"{'kv_len':>7} {'new':>4} " + "".join(f"{n:>12}" for n in impls)
    header += f" {'dense ref':>9}" + "".join(f"{n + '/ref':>14}" for n in impls if n not in DENSE)
    print(header)
    for kv_len, new_tokens, times in rows:
        med = {name: statistics.median(t[clock]) for name, t in times.items()}
        dense = [n for n in impls if n in DENSE]
        line = f"{kv_len:>7} {new_tokens:>4} " + "".join(f"{med[n] * 1e3:>12.1f}" for n in impls)
        if dense:
            ref = min(dense, key=lambda n: med[n])
            line += f" {ref:>9}" + "".join(f"{med[n] / med[ref]:>14.2f}" for n in impls if n not in DENSE)
        print(line)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-lens", type=int, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--impls", nargs="+", default=["vanilla", "sdpa", "topk", "topk_fast"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--topk", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--non-causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1, help="untimed interleaved rounds per case")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(uptime())
    print(
        f"torch {torch.__version__}, {args.threads} threads, B={args.batch} Hq={args.heads} Hkv={args.kv_heads} "
        f"d={args.head_dim} {args.dtype}, causal={not args.non_causal}, forward only (no_grad), "
        f"topk={args.topk} chunk_size={args.chunk_size}, {args.rounds} interleaved rounds (+{args.warmup} warm-up), "
        "medians",
        flush=True,
    )
    rows = []
    for kv_len in args.kv_lens:
        for new_tokens in args.new_tokens:
            q, k, v = inputs(args, kv_len, new_tokens)
            names = list(args.impls)
            times = {name: {"wall": [], "cpu": []} for name in names}
            for r in range(args.warmup + args.rounds):
                # Rotate the order so no implementation always runs after the same neighbour.
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    wall, cpu = time_step(name, q, k, v, args)
                    if r >= args.warmup:
                        times[name]["wall"].append(wall)
                        times[name]["cpu"].append(cpu)
            rows.append((kv_len, new_tokens, times))
            print(
                f"  kv_len={kv_len} new_tokens={new_tokens}: "
                + ", ".join(f"{n} {statistics.median(times[n]['wall']) * 1e3:.1f} ms" for n in names),
                flush=True,
            )
            del q, k, v
    table(rows, args.impls, "wall")
    table(rows, args.impls, "cpu")
    print(uptime())


if __name__ == "__main__":
    main()
