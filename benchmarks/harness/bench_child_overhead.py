"""Benchmark (not a test): what a fresh child process per case costs on the CPU.

    python benchmarks/harness/bench_child_overhead.py [N]

Runs a tiny case N times in-process (warm) and N times through ``run_isolated``
(a child forked from the warm template); the difference of the medians is the
per-case overhead (fork, set-up, writing and reading the result, teardown). The
template's own start (importing torch once) is reported apart, and
``python -c "import torch"`` is timed N times in between as the reference:
absolute seconds drift with the machine's load, the ratio much less. CPU
seconds of the forked children come from the template's ``cutime``/``cstime``
(it reaps them), in clock ticks.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from topk_bench.case import Budget, Case
from topk_bench.child.worker import execute
from topk_bench.run import launcher

TICK = os.sysconf("SC_CLK_TCK")


def reaped_cpu_s(pid: int) -> float:
    """CPU seconds of the children ``pid`` has waited for (``/proc/PID/stat`` fields 16 and 17)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / TICK


def import_torch_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def main(n: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    first = None
    reference: list[float] = []
    for method in ("measured", "predicted"):
        case = Case.make(
            suite="overhead",
            workload="mha",
            impl="vanilla",
            method=method,
            causal=True,
            params={"seq_len": 16, "d_model": 16, "heads": 2},
            warmup=0,
            repeats=1,
        )
        if first is None:  # starts the template: imports torch and warms up
            first = run_isolated_checked(case)
            template_s = time.perf_counter() - start
        execute(case)  # warm this process: imports, dispatch machinery
        inproc = []
        for _ in range(n):
            t = time.perf_counter()
            assert execute(case).status == "ok"
            inproc.append(time.perf_counter() - t)
        walls, startups, cpus = [], [], []
        template = launcher.template_for(launcher._child_env(None))
        for _ in range(n):
            c0, t = reaped_cpu_s(template.proc.pid), time.perf_counter()
            m = run_isolated_checked(case)
            walls.append(time.perf_counter() - t)
            cpus.append(reaped_cpu_s(template.proc.pid) - c0)
            startups.append(m.metadata["child_startup_s"])
            reference.append(import_torch_s())
        med = statistics.median
        overhead = med(walls) - med(inproc)
        print(
            f"{method:9s} in-process {med(inproc) * 1e3:6.1f} ms | child: wall {med(walls) * 1e3:6.1f} ms "
            f"(to ready {med(startups) * 1e3:5.1f} ms), CPU {med(cpus) * 1e3:5.0f} ms | "
            f"overhead per case {overhead * 1e3:6.1f} ms = {overhead / med(reference):.3f} x import torch"
        )
    print(f"template start (first case, imports and warm-up included): {template_s:.2f} s")
    print(f"python -c 'import torch': median {statistics.median(reference):.2f} s of {len(reference)}")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def run_isolated_checked(case: Case):
    m = launcher.run_isolated(case, Budget())
    assert m.status == "ok", m.error
    return m


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
