"""How the readers scale with rows: ``show``, ``show --wide``, ``compare`` (with ``--markdown`` and ``--json``)
and ``plot`` of generated results files of 1,000 to 100,000 rows, each timed as a user runs it.

The files: one suite of 200 labels (the seven implementations' names, numbered) by ``rows / 200`` sizes
(``seq_len``), every row ``ok`` with a peak and five timed samples, as ``topk-bench run`` writes them; BASE and
NEW differ only in their times, so that ``compare`` judges every case. Each command runs as
``python -m topk_bench ...`` in a process of its own from ``--code`` (a checkout: this one by default, or an
extracted older revision for a before/after table), its output thrown away; the table gives its wall time and
its peak resident memory (``wait4``'s ``ru_maxrss``), or ``>T`` when it ran past ``--timeout`` and was killed.
The CPU (model and whether it has AVX-512-BF16, as the project's timings say it) and the 1-minute load from
``/proc/loadavg`` before each command are printed with the table, and ``uptime`` before and after: quote them
beside the numbers (the machine is shared).

    python benchmarks/bench_readers.py                                  # 1,000, 10,000 and 100,000 rows
    python benchmarks/bench_readers.py --rows 1000 10000 --timeout 120 --code /tmp/base  # another checkout
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABELS = 200
IMPLS = ("vanilla", "qchunk", "topk", "topk_sparse", "topk_fast", "performer", "sdpa")
COMMANDS = ("show", "wide", "compare", "plot")
HEADER = (
    "suite,case_id,workload,impl,label,mode,device,device_name,method,status,error,peak_bytes,reserved_bytes,"
    "baseline_bytes,time_median_s,time_iqr_s,time_mean_s,time_min_s,repeats,times_s,flops,torch_version,git_sha,"
    "timestamp,seq_len,batch,d_model,heads,topk,causal,activation,dtype,trust,time_cv,load_start,load_end"
).split(",")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime unavailable"


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def cpu_kind() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = "AVX-512-BF16" if "avx512_bf16" in info else ("AVX2-only" if " avx2" in info else "no AVX2")
    return f"{model}, {flags}, {os.cpu_count()} cores"


def generate(path: Path, rows: int, seed: int) -> None:
    """A results CSV of ``rows`` ok rows: LABELS labels by rows / LABELS sizes."""
    rng = random.Random(seed)
    sizes = max(1, rows // LABELS)
    with open(path, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(HEADER)
        written = 0
        for label in range(LABELS):
            impl = IMPLS[label % len(IMPLS)]
            for size in range(sizes):
                if written == rows:
                    return
                seq_len = 64 * (size + 1)
                times = [0.001 * (1 + size) * (1 + rng.random() * 0.05) for _ in range(5)]
                median = sorted(times)[2]
                out.writerow(
                    [
                        "big",
                        f"{label:04x}{size:012x}",
                        "mha",
                        impl,
                        f"{impl} {label} (topk={label})",
                        "fwd_bwd",
                        "cpu",
                        "AMD EPYC",
                        "measured",
                        "ok",
                        "",
                        1_000_000 + 4096 * seq_len + label,
                        "",
                        1_000_000,
                        median,
                        0.0001,
                        sum(times) / 5,
                        min(times),
                        5,
                        ";".join(f"{t:.6g}" for t in times),
                        10**9,
                        "2.13.0+cpu",
                        "0" * 40,
                        "2026-12-01T00:00:00+00:00",
                        seq_len,
                        1,
                        256,
                        4,
                        label,
                        True,
                        "softmax",
                        "float32",
                        "",
                        0.01,
                        0.5,
                        0.5,
                    ]
                )
                written += 1


def files(directory: Path, rows: int) -> tuple[Path, Path]:
    base, new = directory / f"base-{rows}", directory / f"new-{rows}"
    for folder, seed in ((base, 1), (new, 2)):
        if not (folder / "big.csv").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            generate(folder / "big.csv", rows, seed)
            meta = {"suite": "big", "title": "generated", "workload": "mha", "plot": {"x": "seq_len", "log_x": 0}}
            (folder / "big.meta.json").write_text(json.dumps(meta))
    return base, new


def command(name: str, base: Path, new: Path, scratch: Path) -> list[str]:
    if name == "show":
        return ["show", str(new)]
    if name == "wide":
        return ["show", str(new), "--wide"]
    if name == "compare":
        return ["compare", str(base), str(new), "--markdown", str(scratch / "c.md"), "--json", str(scratch / "c.json")]
    return ["plot", str(new), "--out", str(scratch / "plots")]


def timed(argv: list[str], code: Path, timeout: float) -> tuple[str, str, int | None]:
    """(seconds, peak MiB, exit code) of ``python -m topk_bench ARGV`` run from ``code``; ``>T`` when killed."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(code)}
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "topk_bench", *argv],
        cwd=code,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    killed = False
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - start > timeout and not killed:
            os.killpg(child.pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    seconds = time.monotonic() - start
    peak = f"{usage.ru_maxrss / 1024:.0f}"
    return (
        (f">{timeout:g}" if killed else f"{seconds:.1f}"),
        peak,
        None if killed else os.waitstatus_to_exitcode(status),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a command may take before it is killed")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose topk_bench runs (default: this)")
    parser.add_argument("--data", type=Path, default=None, help="where the generated files go (kept; default: tmp)")
    args = parser.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="bench-readers-"))
    print(f"CPU: {cpu_kind()}")
    print(f"code: {args.code.resolve()}")
    print(f"before: {uptime()}")
    print(f"{'rows':>8}  {'command':<8}  {'seconds':>8}  {'peak MiB':>8}  {'exit':>4}  load before")
    for rows in args.rows:
        base, new = files(data, rows)
        for name in args.commands:
            with tempfile.TemporaryDirectory(prefix="bench-readers-out-") as scratch:
                before = load()
                seconds, peak, code = timed(command(name, base, new, Path(scratch)), args.code, args.timeout)
            print(f"{rows:>8}  {name:<8}  {seconds:>8}  {peak:>8}  {code if code is not None else '-':>4}  {before}")
            sys.stdout.flush()
    print(f"after: {uptime()}")


if __name__ == "__main__":
    main()
