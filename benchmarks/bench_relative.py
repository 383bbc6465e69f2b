"""How ``compare --relative-to sdpa`` and ``show`` scale with rows: generated results files of 1,000 to 100,000
rows a side, each command timed as a user runs it (``python -m topk_bench ...``, a process of its own, its output
thrown away), with ``uptime`` before and after (the machine is shared: quote the load beside the numbers).

The files: at each ``seq_len`` one SDPA row (no ``topk``: the reference of every top-k there) and ``topk_fast`` at
nine values of ``topk``, each with 3 rounds of 3 samples; NEW's topk_fast 1.5x BASE's, so that every case is judged.

    python benchmarks/bench_relative.py                     # 1,000, 10,000 and 100,000 rows
    python benchmarks/bench_relative.py --rows 1000 --timeout 300
"""

from __future__ import annotations

import argparse
import csv
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_SIZE = 10  # sdpa, and topk_fast at nine values of topk, at each seq_len
ROUNDS, REPEATS = 3, 3
HEADER = (
    "suite,case_id,workload,impl,label,mode,device,device_name,method,status,error,peak_bytes,reserved_bytes,"
    "baseline_bytes,time_median_s,time_iqr_s,time_mean_s,time_min_s,repeats,times_s,flops,torch_version,git_sha,"
    "timestamp,seq_len,topk,rounds"
).split(",")


def generate(path: Path, rows: int, seed: int, slower: float = 1.0) -> Path:
    """A results CSV of ``rows`` measured rows (see the module's docstring)."""
    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, HEADER, lineterminator="\n")
        out.writeheader()
        for n in range(rows):
            size, slot = divmod(n, PER_SIZE)
            impl = "sdpa" if slot == 0 else "topk_fast"
            level = 1e-3 * (size + 1) * (1.0 if slot == 0 else 0.3 * slower)
            times = [level * rng.uniform(0.97, 1.03) for _ in range(ROUNDS * REPEATS)]
            row = dict.fromkeys(HEADER, "")
            row.update(
                suite="big", case_id=f"{impl}-{size}-{slot}", workload="mha", impl=impl, label=impl,
                mode="fwd_bwd", device="cpu", method="measured", status="ok", peak_bytes=1000, repeats=REPEATS,
                time_median_s=sorted(times)[len(times) // 2], times_s=";".join(f"{t:.6g}" for t in times),
                seq_len=64 * (size + 1), topk="" if slot == 0 else 8 * slot, rounds=ROUNDS,
            )  # fmt: skip
            out.writerow(row)
    return path


def timed(argv: list[str], timeout: float) -> str:
    start = time.monotonic()
    try:
        subprocess.run([sys.executable, "-m", "topk_bench", *argv], cwd=ROOT, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f">{timeout:g} s"
    return f"{time.monotonic() - start:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as scratch:
        for rows in args.rows:
            base = generate(Path(scratch) / f"base-{rows}.csv", rows, seed=1)
            new = generate(Path(scratch) / f"new-{rows}.csv", rows, seed=2, slower=1.5)
            relative = timed(["compare", str(base), str(new), "--relative-to", "sdpa"], args.timeout)
            show = timed(["show", str(new)], args.timeout)
            print(f"{rows:>7} rows a side: compare --relative-to sdpa {relative}, show {show}", flush=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
