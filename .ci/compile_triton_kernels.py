"""Compile topk_fast's Triton kernels ahead of time for sm_80 (A100) and sm_90 (H100/H200), with no GPU.

Triton's own compiler and its bundled ptxas build every kernel of
:mod:`topk_bench.attention.kernels.triton.training_kernels` in
the configurations the launcher picks for its largest shapes (head sizes 64 and 128, as BERT-base's and
Llama-3-8B's; float32 and bfloat16; the largest k it takes, 256, and the selection at the default 128 too). Prints
a table per kernel (registers, spill bytes, shared memory per architecture) and exits 1 on a compile error, a
spill, or shared memory over the part's per-block limit.

    .venv/bin/python .ci/compile_triton_kernels.py [--arch 80 90]

The decode kernels of ``page_topk`` and ``topk_fast`` (:mod:`topk_bench.attention.kernels.triton.decode_kernels`) are
compiled too, once each at Llama-3-8B's shapes (d = 128, bfloat16, pages of 16).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# Compiled, not interpreted (the test suite's setting must not leak in); FMA contraction on, as Triton 3.9 runs
# kernels by default (set here so that it does not warn).
os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch

# Usable shared memory per block (opt-in maximum): A100 164 KiB, H100/H200 228 KiB.
SHARED_LIMIT = {80: 164 << 10, 90: 228 << 10}
WARP_SIZE = 32


@dataclass(frozen=True)
class Variant:
    """One compiled configuration of a kernel: what the launcher passes for a shape and dtype."""

    kernel: str
    dtype: torch.dtype
    d: int
    dv: int
    topk: int
    causal: bool = True
    relu: bool = False

    @property
    def name(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        act = "relu" if self.relu else "softmax"
        return f"{self.kernel} {dt} d={self.d} dv={self.dv} k={self.topk} {act}"


def variants() -> list[Variant]:
    """Each kernel for float32 and bfloat16 at the largest k the launcher takes (the selection at k = 128 too),
    causal softmax (relu and non-causal
    calls switch a few element-wise lines, no tile), at head sizes 64 (BERT-base) and 128 (Llama-3-8B, the largest
    it takes): the selection walks the head 16 at a time (d = 128 unrolls the most slices); the gathered kernels'
    tiles are ``CHUNK`` x d gathered rows (``CHUNK`` 32 up to d = 64, 16 above), their code does not depend on k."""
    from topk_bench.attention.kernels import triton as tk

    kernels = ("topk_select_kernel", "gathered_forward_kernel", "gathered_backward_kernel")
    # The selection also at the default k = 128: its buffer and final sort are sized by k.
    topks = {"topk_select_kernel": sorted({128, tk.MAX_TOPK})}
    return [
        Variant(kernel, dtype, d, d, topk)
        for kernel in kernels
        for topk in topks.get(kernel, [tk.MAX_TOPK])
        for d in (64, tk.MAX_TRAINING_HEAD_DIM)
        for dtype in (torch.float32, torch.bfloat16)
    ]


_TL = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _source(variant: Variant):
    """An ``ASTSource`` of ``variant``: pointer and integer types of the arguments, the constexprs, launch options."""
    from triton.compiler import ASTSource

    from topk_bench.attention.kernels import triton as tk
    from topk_bench.attention.kernels.triton import training_kernels as kernels

    fn = getattr(kernels, variant.kernel)
    t = "*" + _TL[variant.dtype]
    if variant.kernel == "topk_select_kernel":
        config = tk.select_config(variant.topk, variant.d)
        pointers = {"Q": t, "K": t, "IDX": "*i32", "BUF": "*i64"}
        flags = dict(CAUSAL=variant.causal, ROUND=variant.dtype != torch.float32)
    else:
        config = tk.gathered_config(variant.d, variant.dv)
        pointers = {"Q": t, "K": t, "V": t, "IDX": "*i32", "OUT": t, "LSE": "*fp32"}
        if variant.kernel == "gathered_backward_kernel":
            pointers |= {"DOUT": t, "DQ": t, "DK": "*fp32", "DV_ACC": "*fp32"}
        flags = dict(CAUSAL=variant.causal, RELU=variant.relu, ROUND=variant.dtype != torch.float32)
    warps = config.pop("num_warps")
    constexprs = config | flags
    signature = {}
    for arg in fn.arg_names:
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg in pointers:
            signature[arg] = pointers[arg]
        else:
            signature[arg] = "i32"  # strides, lengths, offset (may be negative), groups, k
    return ASTSource(fn, signature, constexprs=constexprs), {"num_warps": warps}


@dataclass
class Report:
    registers: int
    spill_bytes: int
    shared_bytes: int


def _resource_usage(cubin: bytes) -> tuple[int, int, int]:
    """(registers per thread, local memory bytes per thread, static shared bytes) of the binary triton built, as
    its bundled ``cuobjdump`` reads them: the build's own ``ptxas`` flags, and no second ``ptxas`` run. Triton's
    kernels keep no arrays in local memory, so local bytes are register spills (0: none)."""
    import triton.backends.nvidia as nvidia

    cuobjdump = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        run = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True, check=True)
    usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", run.stdout)
    registers, stack, static_shared, local = (int(n) for n in usage.groups())
    return registers, max(stack, local), static_shared


# The multi-program row top-k (long rows: topk_fast's scores), compiled for both dtypes it reads as the one-program
# row_topk_kernel is.
RADIX_KERNELS = ("radix_histogram_kernel", "radix_count_kernel", "radix_write_kernel")


@dataclass(frozen=True)
class DecodeVariant:
    """One compiled configuration of a decode kernel (:mod:`topk_bench.attention.kernels.triton.decode_kernels`):
    Llama-3-8B's heads (32 query heads, 8 K/V heads, d = 128), bfloat16, pages of 16, causal softmax."""

    kernel: str
    reads: str = "bf16"  # the row top-k's scores (float32 page bounds, topk_fast's bf16 ranking), or the summaries
    d: int = 128
    page_size: int = 16

    @property
    def name(self) -> str:
        what = {
            **{kernel: f" scores={self.reads}" for kernel in ("row_topk_kernel", *RADIX_KERNELS)},
            "page_bounds_kernel": f" summaries={self.reads}",
            "page_attention_kernel": f" page={self.page_size}",
        }
        return f"{self.kernel} bfloat16 d={self.d}{what.get(self.kernel, '')}"


def decode_variants() -> list[DecodeVariant]:
    """Each decode kernel once (its tiles do not depend on the cache length, the budget or k: loops do); the row
    top-k and the page bounds for both dtypes they read (float32 summaries: page_summaries of half keys today)."""
    kernels = ("page_attention_kernel", "decode_scores_kernel", "gathered_split_kernel", "split_combine_kernel")
    return [
        *(
            DecodeVariant(kernel, reads)
            for kernel in ("row_topk_kernel", "page_bounds_kernel", *RADIX_KERNELS)
            for reads in ("fp32", "bf16")
        ),
        *(DecodeVariant(kernel) for kernel in kernels),
    ]


def _decode_source(variant: DecodeVariant):
    """An ``ASTSource`` of a decode kernel as :mod:`topk_bench.attention.kernels.triton.decode` launches it on CUDA."""
    from triton.compiler import ASTSource

    from topk_bench.attention.kernels.triton import decode as td
    from topk_bench.attention.kernels.triton import decode_kernels

    fn = getattr(decode_kernels, variant.kernel)
    d = variant.d
    pointers, config = {
        "row_topk_kernel": ({"SCORES": "*" + variant.reads, "IDX": "*i32"}, td.SELECT_CONFIG),
        "radix_histogram_kernel": ({"SCORES": "*" + variant.reads, "SCRATCH": "*i32"}, td.RADIX_CONFIG),
        "radix_count_kernel": ({"SCORES": "*" + variant.reads, "SCRATCH": "*i32"}, td.RADIX_CONFIG),
        "radix_write_kernel": (
            {"SCORES": "*" + variant.reads, "SCRATCH": "*i32", "IDX": "*i32"},
            td.RADIX_CONFIG | dict(PRIOR=td.PRIOR_CHUNKS),
        ),
        "page_bounds_kernel": (
            {"Q": "*bf16", "S": "*" + variant.reads, "BOUNDS": "*fp32"},
            td.bounds_config(d) | dict(CAUSAL=True, SHARED=True),
        ),
        "page_attention_kernel": (
            {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "TABLE": "*i32", "ACC": "*fp32", "STATS": "*fp32"},
            td.page_config(d, d, variant.page_size) | dict(CAUSAL=True, ROUND=True, HALF_DOT=True),
        ),
        "decode_scores_kernel": (
            {"Q": "*bf16", "K": "*bf16", "SCORES": "*bf16"},
            td.scores_config(d) | dict(CAUSAL=True, HALF_DOT=True),
        ),
        "gathered_split_kernel": (
            {"SCORES": "*bf16", "IDX": "*i32", "V": "*bf16", "ACC": "*fp32", "STATS": "*fp32"},
            td.gathered_split_config(d) | dict(RELU=False),
        ),
        "split_combine_kernel": (
            {"ACC": "*fp32", "STATS": "*fp32", "OUT": "*bf16"},
            td.combine_config(d) | dict(RELU=False),
        ),
    }[variant.kernel]
    constexprs = dict(config)
    warps = constexprs.pop("num_warps")
    signature = {
        arg: "constexpr" if arg in constexprs else pointers.get(arg, "i32")  # strides, lengths, counts
        for arg in fn.arg_names
    }
    return ASTSource(fn, signature, constexprs=constexprs), {"num_warps": warps}


def compile_variant(variant: Variant | DecodeVariant, capability: int) -> Report:
    import triton
    from triton.backends.compiler import GPUTarget

    source, options = _decode_source(variant) if isinstance(variant, DecodeVariant) else _source(variant)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, WARP_SIZE), options=options)
    registers, spills, static_shared = _resource_usage(compiled.asm["cubin"])
    # Per block: what the launch asks for (triton's dynamic shared memory) and what the binary declares.
    return Report(registers, spills, compiled.metadata.shared + static_shared)


def _reason(exc: BaseException) -> str:
    """The innermost cause of a compile error, on one line (triton's own message ends with a caret line)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    lines = [line for line in str(exc).splitlines() if line.strip() and line.strip() != "^"]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def _compile_job(job: tuple[Variant | DecodeVariant, int]) -> Report | str:
    """:func:`compile_variant` in a worker process: its report, or the first line of why it did not compile."""
    try:
        return compile_variant(*job)
    except Exception as exc:  # noqa: BLE001  (any compile error is the finding, reported by the parent)
        return _reason(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=sorted(SHARED_LIMIT), choices=sorted(SHARED_LIMIT))
    args = parser.parse_args(argv)
    try:
        import triton
    except ImportError as exc:
        print(f"compile_triton_kernels: triton is not importable ({exc}); install the dev extra", file=sys.stderr)
        return 2
    start = time.perf_counter()
    failures: list[str] = []
    header = f"{'kernel':<60}" + "".join(f" | sm_{a}: regs spill smem" for a in args.arch)
    print(f"triton {triton.__version__}; shared limit per block: "
          + ", ".join(f"sm_{a} {SHARED_LIMIT[a] >> 10} KiB" for a in args.arch))  # fmt: skip
    print(header)
    print("-" * len(header))
    every: list[Variant | DecodeVariant] = [*variants(), *decode_variants()]
    jobs = [(variant, capability) for variant in every for capability in args.arch]
    # One process per core: ptxas is single-threaded and the variants are independent (triton's cache is
    # process-safe); the table is printed in the variants' order whatever finishes first.
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        outcomes = dict(zip(jobs, pool.map(_compile_job, jobs)))
    for variant in every:
        cells = []
        for capability in args.arch:
            report = outcomes[variant, capability]
            if isinstance(report, str):  # a compile error of one variant: say which, keep going
                failures.append(f"{variant.name} sm_{capability}: compile error: {report}")
                cells.append(f" | sm_{capability}: {'error':>21}")
                continue
            if report.spill_bytes:
                failures.append(f"{variant.name} sm_{capability}: {report.spill_bytes} B of local memory (spills)")
            if report.shared_bytes > SHARED_LIMIT[capability]:
                failures.append(
                    f"{variant.name} sm_{capability}: {report.shared_bytes} B shared > {SHARED_LIMIT[capability]} B"
                )
            cells.append(f" | sm_{capability}: {report.registers:4d} {report.spill_bytes:5d} {report.shared_bytes:6d}")
        print(f"{variant.name:<60}" + "".join(cells), flush=True)
    print(
        f"{len(every)} kernels x {len(args.arch)} architectures in {time.perf_counter() - start:.1f} s "
        f"({min(len(jobs), os.cpu_count() or 1)} processes)"
    )
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
