"""Benchmark (not a test): a command's wall time as a multiple of ``python -c "import torch"``.

    python benchmarks/harness/time_vs_import_torch.py [-n N] -- COMMAND...

Runs COMMAND and the reference alternately, N times each (default 3), and
prints the medians and their ratio with the load average: on shared cores the
absolute seconds drift with the load, the ratio of neighbours much less. E.g.
``-- python -m topk_bench run suites/mha.toml --predict --out /tmp/r --no-resume -q``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("expected a command after --")
    reference = [sys.executable, "-c", "import torch"]
    loads, commands, references = [], [], []
    for _ in range(args.n):
        loads.append(os.getloadavg()[0])
        references.append(timed(reference))
        commands.append(timed(command))
    loads.append(os.getloadavg()[0])
    med = statistics.median
    print(f"command:      median {med(commands):7.2f} s  ({', '.join(f'{t:.2f}' for t in commands)})")
    print(f"import torch: median {med(references):7.2f} s  ({', '.join(f'{t:.2f}' for t in references)})")
    print(
        f"ratio {med(commands) / med(references):.1f}x; load average (1 min) {min(loads):.1f}..{max(loads):.1f} "
        f"on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
