"""Benchmark (not a test): predicted peak of the BERT-base MHA layer, fwd+bwd, causal, at a long length.

    python benchmarks/harness/bench_predict_scale.py [SEQ_LEN] [IMPL ...]

In-process, one implementation after the other (each in its own child with
``--isolated``). Nothing is allocated: the figures come from FakeTensorMode.
"""

from __future__ import annotations

import sys
import time

from topk_bench import attention
from topk_bench.case import Case
from topk_bench.child.worker import execute
from topk_bench.run.launcher import run_isolated

GIB = 1 << 30
# The paper's settings (§3): top-128, query chunks of 1024; Performer with 256 features.
PAPER_OPTIONS = {"topk": 128, "chunk_size": 1024, "nb_features": 256}


def main(argv: list[str]) -> None:
    isolated = "--isolated" in argv
    args = [a for a in argv if a != "--isolated"]
    seq_len = int(args[0]) if args else 65536
    names = args[1:] or [s.name for s in attention.all_specs() if s.predictable]
    for name in names:
        options = {k: v for k, v in PAPER_OPTIONS.items() if k in attention.spec(name).options}
        case = Case.make(
            suite="scale",
            workload="mha",
            impl=name,
            params={"seq_len": seq_len},
            options=options,
            causal=True,
            method="predicted",
        )
        start, cpu = time.perf_counter(), time.process_time()
        m = run_isolated(case) if isolated else execute(case)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        peak = f"{m.peak_bytes / GIB:9.2f} GiB" if m.peak_bytes else " " * 13
        base = f"{m.baseline_bytes / GIB:.3f} GiB" if m.baseline_bytes else ""
        print(
            f"{name:12s} L={seq_len} {m.status:11s} peak {peak} (inputs+params {base}) "
            f"{elapsed:7.2f} s wall" + ("" if isolated else f", {cpu:7.2f} s CPU") + f"  {m.error}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
