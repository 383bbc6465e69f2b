"""The compiled row top-k alone: nanoseconds per scanned score, on the rows ``topk_fast`` selects from.

- ``training``: the score tiles of one head of ``topk_fast``'s 16K causal forward (BERT-base: d = 64, queries
  scaled by 1/8, float32, top-128, tiles of 512 query rows, each as wide as the keys its last row sees, the
  future keys of its diagonal block ``-inf``), every tile of the head; a 16K tile (32 MiB) no longer fits the
  cache, so most of a row comes from memory, as in ``topk_fast``;
- ``decode``: one decode step's rows (Llama-3-8B: 32 query heads on 8 K/V heads of 128, bfloat16, batch 1),
  top-``kv_len / 16``, ranked as ``topk_fast`` ranks them (the bf16 scores' bits made ordered): a kernel that
  takes bf16 scores gets them as they are, an older one their int16 ranks, converted in its time.

Each tile is computed once and handed to every version in turn (the order rotated by round: each version in
turn gets it fresh from its product); the time of a round is the sum over tiles, its ns per score that sum
over the scores scanned. Beside them ``read once``, one pass reading every score (``torch.amax``): the floor
of any exact selection of those rows, what the memory alone costs. ``--before REV`` adds the kernel as of a
git revision (its ``topk_bench.attention`` package extracted and imported under another name, its kernels built
from its own sources). Medians over ``--rounds``; ``uptime`` before and after.

    python benchmarks/bench_row_topk.py --before 45c95a8 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_topk_fast import load_revision

from topk_bench import attention
from topk_bench.attention.methods.topk_fast import _ordered_bits


def training_tiles(length: int, rows: int, k: int):
    """(scores [1, rows, width], k) of every row tile of one causal head."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(length, 64, generator=g) / 8
    keys = torch.randn(length, 64, generator=g)
    for r0 in range(0, length, rows):
        r1 = min(r0 + rows, length)
        width = max(r1, k)  # as topk_fast: at least k columns, the keys past the tile masked
        scores = q[r0:r1] @ keys[:width].T
        future = torch.ones(r1 - r0, width - r0, dtype=torch.bool).triu_(1)
        scores[:, r0:].masked_fill_(future, float("-inf"))
        yield scores.unsqueeze(0), k


def decode_tiles(kv_len: int, k: int):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(8, 4, 128, generator=g).to(torch.bfloat16)
    keys = torch.randn(8, kv_len, 128, generator=g).to(torch.bfloat16)
    yield q @ keys.transpose(1, 2), k


class ReadOnce:
    """The floor of any exact selection: one pass that reads every score (torch's row maximum)."""

    @staticmethod
    def available(dtype):
        return True

    @staticmethod
    def row_topk_(scores, k, values, indices):
        torch.amax(scores, dim=-1)


def cases(name: str, args):
    return (
        training_tiles(args.length, args.tile_rows, 128)
        if name == "training"
        else decode_tiles(args.kv_len, args.kv_len // 16)
    )


def timed(native, scores, k, clock) -> float:
    """Seconds of one selection of ``scores`` by ``native``'s kernel; half scores a kernel does not take are
    converted to their int16 ranks first, inside the time (as ``topk_fast``'s decode did before the kernel took
    them)."""
    ranked = scores.dtype in (torch.bfloat16, torch.float16) and not native.available(scores.dtype)
    dtype = torch.int16 if ranked else scores.dtype
    values = torch.empty(*scores.shape[:2], k, dtype=dtype)
    indices = torch.empty(*scores.shape[:2], k, dtype=torch.int64)
    start = clock()
    native.row_topk_(_ordered_bits(scores) if ranked else scores, k, values, indices)
    return clock() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384, help="training: tokens of the causal head")
    parser.add_argument("--kv-len", type=int, default=131072, help="decode: cached tokens")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tile-rows", type=int, default=512, help="training: query rows a tile (topk_fast: 512)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="cpu", help="cpu: this thread's CPU time")
    parser.add_argument("--before", metavar="REV", help="also time the kernel as of this git revision")
    choices = ["training", "decode"]
    parser.add_argument("--cases", nargs="+", default=choices, choices=choices)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" and args.threads == 1 else time.perf_counter
    versions = {"now": attention.kernels.native}
    if args.before:
        versions[args.before] = load_revision(args.before).native
    versions["read once"] = ReadOnce
    for native in versions.values():  # built (or loaded) before any clock runs
        timed(native, torch.randn(1, 2, 1024), 8, clock)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{args.threads} thread(s), {args.clock} clock, {args.rounds} rounds; {uptime}")
    for case in args.cases:
        seconds = {name: [] for name in versions}
        scanned = 0
        for r in range(args.rounds):
            names = list(versions)[r % len(versions) :] + list(versions)[: r % len(versions)]
            total = dict.fromkeys(names, 0.0)
            scanned = 0
            for scores, k in cases(case, args):
                scanned += scores.numel()
                for name in names:
                    total[name] += timed(versions[name], scores, k, clock)
            for name in names:
                seconds[name].append(total[name])
        print(f"\n{case}: {scanned / 1e6:.1f} M scores scanned a round")
        print(f"{'version':<12} {'median s':>10} {'ns/score':>9} {'min':>8} {'max':>8}")
        for name, ts in seconds.items():
            med = statistics.median(ts)
            print(f"{name:<12} {med:10.4f} {med / scanned * 1e9:9.3f} {min(ts):8.4f} {max(ts):8.4f}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
