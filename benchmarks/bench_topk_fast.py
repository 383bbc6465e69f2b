"""Side-by-side benchmark of ``topk_fast`` against ``topk``, ``vanilla`` and ``sdpa`` (issue 7).

Forward + backward (``loss = out.mean()``) of the attention function, fp32, on
the CPU. Implementations are interleaved within each round (the machine is
shared, so load drifts), and the table reports medians over rounds and ratios
of medians. Peak memory is the exact live-tensor-bytes peak (inputs included),
measured with ``topk_bench.measure.memory.LiveBytes`` under ``FakeTensorMode`` (same
allocations as a real run, no time and no memory spent), or in a real run with
``--memory real``.

    python benchmarks/bench_topk_fast.py --lengths 8192 --repeats 5
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import implementations  # noqa: E402
from topk_bench.measure.memory import LiveBytes  # noqa: E402

OPTIONS = {"topk": {"topk": 128, "chunk_size": 1024}, "topk_fast": {"topk": 128, "chunk_size": 1024}}


def inputs(b, h, length, d, dtype=torch.float32):
    q = (torch.randn(b, h, length, d, dtype=dtype) / math.sqrt(d)).requires_grad_()
    k = torch.randn(b, h, length, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, h, length, d, dtype=dtype, requires_grad=True)
    return q, k, v


def step(name, q, k, v, causal):
    out = implementations.get(name)(q, k, v, causal=causal, **OPTIONS.get(name, {}))
    out.mean().backward()


def run_once(name, shape, causal):
    q, k, v = inputs(*shape)
    start = time.perf_counter()
    step(name, q, k, v, causal)
    return time.perf_counter() - start


def peak_bytes(name, shape, causal, real=False):
    """Exact peak of live tensor bytes over forward + backward, inputs and gradients included."""
    if real:
        q, k, v = inputs(*shape)
        with LiveBytes() as tracker:
            tracker.register(q, k, v)
            step(name, q, k, v, causal)
        return tracker.peak_bytes
    with FakeTensorMode():
        q, k, v = inputs(*shape)
        with LiveBytes() as tracker:
            tracker.register(q, k, v)
            step(name, q, k, v, causal)
    return tracker.peak_bytes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192])
    parser.add_argument("--impls", nargs="+", default=["vanilla", "topk", "topk_fast", "sdpa"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--non-causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-memory", type=float, default=16.0, help="GiB; skip bigger (predicted) cases")
    parser.add_argument("--memory", choices=["predict", "real"], default="predict")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    causal = not args.non_causal
    print(f"torch {torch.__version__}, {args.threads} threads, B={args.batch} H={args.heads} d={args.head_dim}, "
          f"causal={causal}, fp32, fwd+bwd, {args.repeats} interleaved rounds, memory={args.memory}")
    for length in args.lengths:
        shape = (args.batch, args.heads, length, args.head_dim)
        peaks = {name: peak_bytes(name, shape, causal, real=args.memory == "real") for name in args.impls}
        names = [n for n in args.impls if peaks[n] <= args.max_memory * 2**30]
        times = {name: [] for name in names}
        for _ in range(2):  # warm-up: allocator, thread pool, BLAS packing at a small size
            for name in names:
                run_once(name, (1, 2, 2048, args.head_dim), causal)
        for r in range(args.repeats):
            # Rotate the order so no implementation always runs after the same neighbour.
            for name in names[r % len(names):] + names[: r % len(names)]:
                times[name].append(run_once(name, shape, causal))
            # Progress as it comes: a run stopped early still shows its finished rounds.
            print(f"  L={length} round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names), flush=True)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        print(f"\nL={length}")
        print(f"{'impl':<10} {'median s':>9} {'min s':>8} {'max s':>8} {'peak MiB':>9}"
              + "".join(f" {'/' + n:>10}" for n in names))
        for name in args.impls:
            if name not in med:
                print(f"{name:<10} {'skipped':>9} {'':>8} {'':>8} {peaks[name] / 2**20:9.0f}  (over --max-memory)")
                continue
            ratios = "".join(f" {med[name] / med[other]:10.3f}" for other in names)
            print(f"{name:<10} {med[name]:9.3f} {min(times[name]):8.3f} {max(times[name]):8.3f} "
                  f"{peaks[name] / 2**20:9.0f}{ratios}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
