"""Predicted against measured peak bytes of every shipped implementation, in float32, bfloat16 and float16.

One causal mha layer (heads of 64, 12 by default: suites/mha.toml's BERT-base; batch 1, forward and backward),
each implementation with its registered options but ``topk = 64`` (issue 42's case), at each ``--seq-len``:
the CPU prediction (``--predict``, a FakeTensor run) beside the CPU measurement (the live-bytes tracker of a real
run) of the same case, in this process, one thread. Prints a Markdown table and the CPU it ran on; exits 1 if any
predicted peak or baseline differs from the measured one by a byte, 0 otherwise.

    .venv/bin/python scripts/dtype_peaks.py                        # 1024 and 4096 tokens
    .venv/bin/python scripts/dtype_peaks.py --seq-len 512 --impl topk_fast --dtype bfloat16
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from topk_bench import attention
from topk_bench.attention import provenance
from topk_bench.case import Case
from topk_bench.child.execute import execute
from topk_bench.measure.metadata import cpu_flags, cpu_model

DTYPES = ("float32", "bfloat16", "float16")


def case(impl: str, dtype: str, seq_len: int, method: str, heads: int = 12, head_dim: int = 64) -> Case:
    spec = attention.spec(impl)
    return Case.make(
        suite="dtype-peaks",
        workload="mha",
        impl=impl,
        params={"d_model": heads * head_dim, "heads": heads, "batch": 1, "seq_len": seq_len},
        options={"topk": 64} if "topk" in spec.options else {},
        causal=True,
        dtype=dtype,
        method=method,
        warmup=0,
        repeats=1,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--impl", nargs="+", default=[s.name for s in attention.all_specs()])
    parser.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--heads", type=int, default=12, help="heads of 64 (12: BERT-base; fewer: a shared machine)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    flags = cpu_flags() or "none"
    print(f"CPU: {cpu_model()}; bf16/AMX flags: {flags}; torch {torch.__version__}, capability ", end="")
    print(f"{torch.backends.cpu.get_cpu_capability()}; mha, causal, {args.heads} heads of 64, fwd+bwd, topk 64")
    print()
    print("| implementation | dtype | seq_len | predicted B | measured B | predicted - measured | code_path |")
    print("|---|---|---:|---:|---:|---:|---|")
    mismatches = 0
    start = time.perf_counter()
    for seq_len in args.seq_len:
        for impl in args.impl:
            for dtype in args.dtype:
                predicted = execute(case(impl, dtype, seq_len, "predicted", args.heads))
                measured = execute(case(impl, dtype, seq_len, "measured", args.heads))
                path = provenance.code_path(impl, device="cpu", dtype=getattr(torch, dtype))
                if predicted.status != "ok" or measured.status != "ok":
                    gap = f"predicted {predicted.status}, measured {measured.status}"
                else:
                    off = predicted.peak_bytes - measured.peak_bytes
                    base_off = predicted.baseline_bytes - measured.baseline_bytes
                    mismatches += off != 0 or base_off != 0
                    gap = f"{off:+,}" + (f" (baseline {base_off:+,})" if base_off else "")
                print(
                    f"| {impl} | {dtype} | {seq_len} | {predicted.peak_bytes or 0:,} | {measured.peak_bytes or 0:,} "
                    f"| {gap} | {path} |",
                    flush=True,
                )
    print(f"\n{mismatches} mismatches; {time.perf_counter() - start:.0f} s")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
