"""topk_fast against SDPA (and topk, vanilla), side by side: interleaved ratios at 4K, 8K, 16K (issue 28).

Forward + backward (``loss = out.mean()``) of one causal BERT-base attention layer's
attention (B=1, 12 heads of 64), fp32, top-128, chunk 1024, on the CPU with ``--threads``
(2). Every round runs each implementation once, in a rotated order (the machine is shared,
so load drifts); the table gives the median over rounds of each one's time, the median and
quartiles of its per-round ratio to SDPA's time in the same round, and ratios of medians to
the others. ``--before REV`` adds ``topk_fast`` as of a git revision (its ``topk_bench.attention``
package extracted and imported under another name), interleaved in the same rounds, for a
before/after table in one run. Peak memory is the exact live-tensor-bytes peak (inputs
included) of ``topk_bench.measure.memory.LiveBytes`` under ``FakeTensorMode`` (same
allocations as a real run, nothing allocated), or of a real run with ``--memory real``;
cases above ``--max-memory`` are skipped (vanilla at 16K). The CPU's capability and
``uptime`` before and after are printed: quote them beside the ratios. On a busy machine,
``--threads 1 --clock cpu`` times the process's CPU time instead of wall time.

    python benchmarks/bench_topk_fast.py                       # 4K, 8K, 16K, 5 rounds
    python benchmarks/bench_topk_fast.py --before e450331 --lengths 16384 --rounds 7
    python benchmarks/bench_topk_fast.py --threads 1 --clock cpu --impls topk_fast sdpa  # busy machine
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import topk_bench.attention
from topk_bench.measure.memory import LiveBytes

OPTIONS = {"topk": {"topk": 128, "chunk_size": 1024}, "topk_fast": {"topk": 128, "chunk_size": 1024}}


def _sources(git: list[str], sha: str, folder: str) -> list[str]:
    listed = subprocess.run(git + ["ls-tree", "-r", "--name-only", sha, folder], capture_output=True, text=True)
    return [f for f in listed.stdout.split() if f.endswith((".py", ".c", ".h"))]


def load_revision(rev: str):
    """The ``topk_bench.attention`` package as of git revision ``rev``, imported as ``implementations_<sha>``.

    Its files are extracted to a temporary directory with the package name replaced, so that
    it imports (and registers into) itself, beside the working tree's package.
    """
    root = Path(__file__).resolve().parents[1]
    git = ["git", "-C", str(root)]
    sha = subprocess.run(git + ["rev-parse", "--short", rev], capture_output=True, text=True, check=True).stdout.strip()
    name = f"attention_{sha}"
    dest = Path(tempfile.mkdtemp(prefix="topk-bench-rev-"))
    # The package's folder and dotted name at that revision: topk_bench/attention, or implementations before it.
    layouts = (("topk_bench/attention", r"\btopk_bench\.attention\b"), ("implementations", r"\bimplementations\b"))
    folder, dotted, files = next((f, d, found) for f, d in layouts if (found := _sources(git, sha, f)))
    for file in files:
        text = subprocess.run(git + ["show", f"{sha}:{file}"], capture_output=True, text=True, check=True).stdout
        target = dest / name / Path(file).relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(re.sub(dotted, name, text))
    sys.path.insert(0, str(dest))
    return importlib.import_module(name)


def inputs(b, h, length, d, dtype=torch.float32):
    q = (torch.randn(b, h, length, d, dtype=dtype) / math.sqrt(d)).requires_grad_()
    k = torch.randn(b, h, length, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, h, length, d, dtype=dtype, requires_grad=True)
    return q, k, v


def run_once(fn, shape, causal, options, clock=time.perf_counter):
    q, k, v = inputs(*shape)
    start = clock()
    fn(q, k, v, causal=causal, **options).mean().backward()
    return clock() - start


def peak_bytes(fn, shape, causal, options, real=False):
    """Exact peak of live tensor bytes over forward + backward, inputs and gradients included."""
    context = contextlib.nullcontext() if real else FakeTensorMode()
    with context:
        q, k, v = inputs(*shape)
        with LiveBytes() as tracker:
            tracker.register(q, k, v)
            fn(q, k, v, causal=causal, **options).mean().backward()
    return tracker.peak_bytes


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--impls", nargs="+", default=["topk_fast", "sdpa", "topk", "vanilla"])
    parser.add_argument("--before", metavar="REV", help="also run topk_fast as of this git revision, interleaved")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--non-causal", action="store_true")
    parser.add_argument("--rounds", "--repeats", type=int, default=5, dest="rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the process's CPU time (with --threads 1, robust to other processes' load)",
    )
    parser.add_argument("--max-memory", type=float, default=16.0, help="GiB; skip bigger (predicted) cases")
    parser.add_argument("--memory", choices=["predict", "real"], default="predict")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    causal = not args.non_causal
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    fns = {name: (topk_bench.attention.get(name), OPTIONS.get(name, {})) for name in args.impls}
    if args.before:
        fns[f"topk_fast@{args.before}"] = (load_revision(args.before).get("topk_fast"), OPTIONS["topk_fast"])
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, {args.threads} "
        f"threads; B={args.batch} H={args.heads} d={args.head_dim}, causal={causal}, fp32, fwd+bwd, top-128, "
        f"chunk 1024, {args.rounds} interleaved rounds, {args.clock} clock, memory={args.memory}"
    )
    print(f"  before: {uptime()}", flush=True)
    for length in args.lengths:
        shape = (args.batch, args.heads, length, args.head_dim)
        peaks = {n: peak_bytes(fn, shape, causal, o, real=args.memory == "real") for n, (fn, o) in fns.items()}
        names = [n for n in fns if peaks[n] <= args.max_memory * 2**30]
        times = {name: [] for name in names}
        for _ in range(2):  # warm-up: allocator, thread pool, BLAS packing at a small size
            for name in names:
                run_once(fns[name][0], (1, 2, 2048, args.head_dim), causal, fns[name][1])
        for r in range(args.rounds):
            # Rotate the order so no implementation always runs after the same neighbour.
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(run_once(fns[name][0], shape, causal, fns[name][1], clock))
            # Progress as it comes: a run stopped early still shows its finished rounds.
            print(f"  L={length} round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names), flush=True)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        ref = "sdpa" if "sdpa" in times else None
        print(f"\nL={length}  ({uptime()})")
        print(
            f"{'impl':<22} {'median s':>9} {'min s':>8} {'max s':>8} {'peak MiB':>9} {'/sdpa':>7} {'round q1-q3':>13}"
            + "".join(f" {'/' + n:>12}" for n in names if n != ref)
        )
        for name in fns:
            if name not in med:
                print(f"{name:<22} {'skipped':>9} {'':>8} {'':>8} {peaks[name] / 2**20:9.0f}  (over --max-memory)")
                continue
            spread = f"{min(times[name]):8.3f} {max(times[name]):8.3f}"
            line = f"{name:<22} {med[name]:9.3f} {spread} {peaks[name] / 2**20:9.0f}"
            if ref:
                per_round = [t / s for t, s in zip(times[name], times[ref])]
                q1, q2, q3 = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else (per_round * 3)
                line += f" {q2:7.3f} {q1:6.3f}-{q3:<6.3f}"
            line += "".join(f" {med[name] / med[other]:12.3f}" for other in names if other != ref)
            print(line)
        sys.stdout.flush()
    print(f"  after:  {uptime()}")


if __name__ == "__main__":
    main()
