"""Where ``topk_fast``'s training step spends its time: every aten op's CPU time, grouped into phases.

One forward + backward (``loss = out.mean()``) of causal attention with BERT-base heads
(B=1, H=12, d=64, fp32, top-128, chunk 1024) at ``--lengths``. Each aten op is timed by a
``TorchDispatchMode`` with ``time.thread_time()`` around it: the CPU time of the calling
thread, so the table holds on a machine whose cores are shared (wall time there includes
the waits for a core). Run with ``--threads 1`` (the default) for CPU times that add up:
with more threads, the other threads' share of an op is not counted.

Phases (by op, forward and backward told apart): the score product (``bmm``/``mm``), the
selection (``topk`` or the compiled ``row_topk_``, ``gather``, ``amax``, masks and index arithmetic), the bags
(``embedding_bag`` and its sampled product), the key-sorted transpose (``sort``,
``searchsorted``, ``index_select`` of the entries), and the rest. ``--before REV`` runs the
``topk_fast`` of a git revision beside the working tree's, round by round, for a before/after
table (``REV``'s ``topk_bench.attention`` package is extracted to a temporary directory and
imported under another name).

    python benchmarks/bench_topk_fast_phases.py --lengths 16384 --before HEAD~3
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_topk_fast import load_revision  # noqa: E402

import topk_bench.attention  # noqa: E402

PRODUCT = {"bmm", "mm", "matmul", "baddbmm", "addmm"}
BAGS = {"_embedding_bag", "_embedding_bag_forward_only", "_embedding_bag_per_sample_weights_backward", "embedding_bag"}
TRANSPOSE = {
    "key_sort_",
    "sort",
    "searchsorted",
    "index_select",
    "floor_divide",
    "bitwise_right_shift",
    "bincount",
    "cumsum",
    "index_add_",
    "scatter_add_",
}
SELECTION = {
    "topk",
    "row_topk_",
    "gather",
    "amax",
    "masked_fill_",
    "remainder",
    "div",
    "mul",
    "add",
    "sub",
    "bitwise_and",
    "bitwise_xor",
    "__rshift__",
    "__and__",
    "ge",
    "gt",
    "le",
    "lt",
    "arange",
    "logical_not",
    "logical_not_",
    "clamp",
    "clamp_",
    "clamp_max",
    "max_pool1d",
    "maximum",
    "where",
    "take",
    "bitwise_and_",
    "bitwise_xor_",
    "masked_fill",
    "eq",
    "ne",
    "expand",
    "repeat_interleave",
    "cat",
}


class OpTimes(TorchDispatchMode):
    """CPU time (``time.thread_time``) of every aten op run under it, by op name and scope."""

    def __init__(self):
        super().__init__()
        self.scope = "fwd"
        self.seconds = collections.defaultdict(float)
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.thread_time()
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.seconds[(self.scope, name)] += time.thread_time() - start
        self.calls[(self.scope, name)] += 1
        return out


def phase(scope: str, op: str) -> str:
    if op in PRODUCT:
        return f"{scope}: score product" if scope == "fwd" else "bwd: products"
    if op in BAGS:
        return f"{scope}: bags" if op != "_embedding_bag_per_sample_weights_backward" else f"{scope}: sampled dW"
    if scope == "bwd" and op in TRANSPOSE:
        return "bwd: key-sorted transpose"
    if scope == "fwd" and op in SELECTION | {"index_select"}:
        return "fwd: selection"
    return f"{scope}: other"


def inputs(length, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(1, 12, length, 64, generator=g) / 8).requires_grad_()
    k = torch.randn(1, 12, length, 64, generator=g).requires_grad_()
    v = torch.randn(1, 12, length, 64, generator=g).requires_grad_()
    return q, k, v


def measure(fn, length):
    q, k, v = inputs(length)
    mode = OpTimes()
    with mode:
        out = fn(q, k, v, causal=True, topk=128, chunk_size=1024)
        mode.scope = "bwd"
        out.mean().backward()
    return mode


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each version; each op's least total is kept")
    parser.add_argument("--before", metavar="REV", help="also time topk_fast as of this git revision")
    parser.add_argument("--ops", type=int, default=12, help="ops listed per version (by CPU time)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    versions = {"now": topk_bench.attention.get("topk_fast")}
    if args.before:
        versions[args.before] = load_revision(args.before).get("topk_fast")
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
        f"{args.threads} thread(s); {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
    )
    for length in args.lengths:
        best = {name: None for name in versions}
        for _ in range(args.rounds):
            for name, fn in versions.items():  # interleaved: the same load for both versions
                mode = measure(fn, length)
                seen = dict(mode.seconds)
                best[name] = (
                    seen
                    if best[name] is None
                    else {key: min(seen.get(key, 0.0), best[name].get(key, 0.0)) for key in set(seen) | set(best[name])}
                )
                calls = mode.calls
        print(f"\nL={length}: CPU seconds per phase (least of {args.rounds} rounds)")
        phases = collections.defaultdict(lambda: collections.defaultdict(float))
        for name, seconds in best.items():
            for (scope, op), s in seconds.items():
                phases[phase(scope, op)][name] += s
        names = list(versions)
        print(f"{'phase':<28}" + "".join(f"{n:>12}" for n in names))
        order = [
            "fwd: score product",
            "fwd: selection",
            "fwd: bags",
            "fwd: other",
            "bwd: sampled dW",
            "bwd: key-sorted transpose",
            "bwd: bags",
            "bwd: products",
            "bwd: other",
        ]
        for p in order + sorted(set(phases) - set(order)):
            if p in phases:
                print(f"{p:<28}" + "".join(f"{phases[p][n]:12.3f}" for n in names))
        print(f"{'total':<28}" + "".join(f"{sum(best[n].values()):12.3f}" for n in names))
        for name in names:
            print(f"\n  {name}: top ops (scope, op, CPU s)")
            for (scope, op), s in sorted(best[name].items(), key=lambda kv: -kv[1])[: args.ops]:
                print(f"    {scope} {op:<45} {s:8.3f}")
        del calls
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
