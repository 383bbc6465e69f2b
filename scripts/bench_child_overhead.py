"""Benchmark (not a test): what a fresh child process per case costs on the CPU.

    python scripts/bench_child_overhead.py [N]

Runs a tiny case N times in-process (warm) and N times through ``run_isolated``;
the difference is the per-case overhead (spawn, imports, set-up, teardown).
Prints wall and CPU seconds: on shared, overloaded cores the CPU time is the
stable figure.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

from topk_bench.case import Budget, Case
from topk_bench.run.launcher import run_isolated
from topk_bench.measure.worker import execute


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(n: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for method in ("measured", "predicted"):
        case = Case.make(suite="overhead", workload="mha", impl="vanilla", method=method, causal=True,
                         params={"seq_len": 16, "d_model": 16, "heads": 2}, warmup=0, repeats=1)
        execute(case)  # warm this process: imports, dispatch machinery
        inproc, inproc_cpu = [], []
        for _ in range(n):
            t, c = time.perf_counter(), time.process_time()
            assert execute(case).status == "ok"
            inproc.append(time.perf_counter() - t)
            inproc_cpu.append(time.process_time() - c)
        walls, startups, cpus = [], [], []
        for _ in range(n):
            c0, t = cpu_children(), time.perf_counter()
            m = run_isolated(case, Budget())
            walls.append(time.perf_counter() - t)
            cpus.append(cpu_children() - c0)
            startups.append(m.metadata["child_startup_s"])
            assert m.status == "ok", m.error
        med = statistics.median
        print(f"{method:9s} in-process {med(inproc) * 1e3:7.1f} ms | child: wall {med(walls):5.2f} s "
              f"(start-up to ready {med(startups):5.2f} s), CPU {med(cpus):5.2f} s | "
              f"overhead per case: wall {med(walls) - med(inproc):5.2f} s, CPU {med(cpus) - med(inproc_cpu):5.2f} s")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
