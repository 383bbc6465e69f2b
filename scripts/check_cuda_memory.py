"""A check on a real GPU (not a test): the CUDA statuses, baseline, workspace and peaks of issue 14, items 2-4.

    python scripts/check_cuda_memory.py OUT_DIR

Each part prints PASS or FAIL lines; the exit code is the number of FAILs. Every measurement runs in
its own child process (``run_isolated``, as ``topk-bench run`` does), so an OOM leaves nothing behind.

1. Statuses (item 2): a vanilla layer far past the device in a child: ``oom`` under the default
   30 GiB budget; one that fits the device but not a 1 GiB budget: ``over_budget`` with its numbers;
   the device filled by torch, then cuBLAS's first matmul in that process: what it raises and how
   ``worker.classify`` calls it; the run plan's budget capped to the device's memory.
2. Memory (items 3, 4): per implementation at L=2048, measured against predicted: baseline (parameters
   and inputs, both sides), workspace, ``peak - workspace`` against the predicted peak, reserved
   against allocated.
3. The CLI on a small suite (mha, L 1K to 64K, vanilla and SDPA): CSV columns, statuses (vanilla
   ``oom`` at 32K, the size after it ``skipped``), and ``topk-bench plot`` with the reserved memory row.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from topk_bench.case import Budget, Case
from topk_bench.run.launcher import run_isolated

GIB, MIB = 2**30, 2**20
FAILS: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)
    if not ok:
        FAILS.append(what)


def case(impl: str, seq_len: int, method: str = "measured", **options) -> Case:
    return Case.make(
        suite="check",
        workload="mha",
        impl=impl,
        label=impl,
        causal=True,
        device="cuda",
        method=method,
        warmup=1,
        repeats=3,
        params={"seq_len": seq_len},
        options=options,
    )


FILL_THEN_MATMUL = textwrap.dedent("""
    import torch
    from topk_bench.case import Budget, Case
    from topk_bench.child.worker import classify
    kept, size = [], 1 << 30
    torch.cuda.init()
    while size >= 1 << 20:  # fill the device through torch's allocator, before cuBLAS has a handle
        try:
            kept.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            size //= 2
    case = Case.make(suite="check", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cuda")
    try:
        x = kept[-1][: 4 * 64 * 64].view(torch.float32).view(64, 64)
        (x @ x).sum().item()
        print("no failure: cuBLAS found room (its handle and workspace need little)")
    except Exception as exc:
        status, message = classify(exc, Budget(max_memory_bytes=30 << 30), case)
        print(f"STATUS {status} <- {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
""")


def statuses() -> None:
    print("== 1. statuses (item 2)", flush=True)
    free, total = torch.cuda.mem_get_info()
    print(f"device: {torch.cuda.get_device_name()}, {total / GIB:.1f} GiB ({free / GIB:.1f} free)")
    huge = run_isolated(case("vanilla", 65536), Budget(max_memory_bytes=30 * GIB, max_seconds=300))
    check(
        huge.status == "oom", f"vanilla L=65536 (>200 GiB of scores), 30 GiB budget: {huge.status} ({huge.error[:120]})"
    )
    over = run_isolated(case("vanilla", 8192), Budget(max_memory_bytes=1 * GIB, max_seconds=300))
    check(
        over.status == "over_budget" and over.peak_bytes and over.reserved_bytes,
        f"vanilla L=8192, 1 GiB budget: {over.status}, peak {over.peak_bytes} reserved {over.reserved_bytes} "
        f"({over.error})",
    )
    proc = subprocess.run([sys.executable, "-c", FILL_THEN_MATMUL], capture_output=True, text=True, timeout=300)
    line = next(
        (ln for ln in proc.stdout.splitlines() if ln.startswith(("STATUS", "no failure"))),
        (proc.stderr.strip().splitlines() or ["no output"])[-1],
    )
    check(not line.startswith("STATUS") or line.startswith("STATUS oom"), f"device full, then a first matmul: {line}")
    from topk_bench.run.plan import capped_budget, memory_cap

    budget, note = capped_budget(1000 * GIB, *memory_cap("cuda", predict=False))
    check(budget == total and note is not None, f"a 1000 GiB budget on cuda: {budget} bytes; {note}")


def memory() -> None:
    print("== 2. memory per implementation at L=2048, measured (one child each) against predicted (items 3, 4)")
    print(
        f"{'impl':10} {'baseline':>10} {'pred.base':>10} {'workspace':>10} {'peak':>11} {'peak-ws':>11} "
        f"{'predicted':>11} {'meas/pred':>9} {'reserved':>11} {'res/alloc':>9}"
    )
    for impl, options in (
        ("vanilla", {}),
        ("sdpa", {}),
        ("qchunk", {"chunk_size": 512}),
        ("topk", {"chunk_size": 512, "topk": 128}),
        ("performer", {"nb_features": 256}),
    ):
        m = run_isolated(case(impl, 2048, **options), Budget(max_memory_bytes=30 * GIB, max_seconds=300))
        p = run_isolated(case(impl, 2048, method="predicted", **options), Budget(max_seconds=300))
        if m.status != "ok" or p.status != "ok":
            check(False, f"{impl}: measured {m.status} {m.error[:100]} / predicted {p.status} {p.error[:100]}")
            continue
        workspace = m.extra.get("workspace_bytes")
        above = m.peak_bytes - workspace
        print(
            f"{impl:10} {m.baseline_bytes:>10} {p.baseline_bytes:>10} {workspace:>10} {m.peak_bytes:>11} "
            f"{above:>11} {p.peak_bytes:>11} {above / p.peak_bytes:>9.4f} {m.reserved_bytes:>11} "
            f"{m.reserved_bytes / m.peak_bytes:>9.3f}",
            flush=True,
        )
        check(m.baseline_bytes == p.baseline_bytes, f"{impl}: baseline measured = predicted (parameters + inputs)")
        check(
            workspace > 0 and m.reserved_bytes >= m.peak_bytes,
            f"{impl}: workspace {workspace / MIB:.1f} MiB, reserved >= allocated",
        )


def cli(out: Path) -> None:
    print("== 3. topk-bench run and plot on cuda (items 2-4 through the CLI)", flush=True)
    suite = out / "check_mha.toml"
    suite.write_text(
        textwrap.dedent("""
        name = "check_mha"
        workload = "mha"
        causal = true
        repeats = 3
        [sweep]
        seq_len = [1024, 4096, 32768, 65536]
        [[impl]]
        name = "vanilla"
        [[impl]]
        name = "sdpa"
        [plot]
        memory = "reserved"
    """)
    )
    bench = [sys.executable, "-m", "topk_bench"]
    run = subprocess.run(
        [*bench, "run", str(suite), "--device", "cuda", "--out", str(out / "run"), "--no-resume", "-q"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    print(run.stdout[-1500:], run.stderr[-1500:])
    rows = list(csv.DictReader((out / "run" / "check_mha.csv").open()))
    for r in rows:
        print(
            f"  {r['impl']:8} L={r['seq_len']:>6} {r['status']:12} peak {r['peak_bytes']:>11} "
            f"reserved {r['reserved_bytes']:>11} baseline {r['baseline_bytes']:>10} "
            f"workspace {r.get('workspace_bytes', 'NO COLUMN'):>9} {r['error'][:70]}"
        )
    got = {(r["impl"], r["seq_len"]): r["status"] for r in rows}
    check(
        got.get(("vanilla", "32768")) == "oom"
        and got.get(("vanilla", "65536")) == "skipped"
        and all(got.get(("sdpa", str(n))) == "ok" for n in (1024, 4096, 32768, 65536)),
        f"vanilla oom at 32K (scores alone 48 GiB, three of them live), skipped after; sdpa ok: {got}",
    )
    check(all(r.get("workspace_bytes") for r in rows if r["status"] == "ok"), "every ok row has workspace_bytes")
    plot = subprocess.run(
        [*bench, "plot", str(out / "run"), "--out", str(out / "plots")], capture_output=True, text=True, timeout=200
    )
    check(plot.returncode == 0, f"plot: {plot.stdout.strip()} {plot.stderr.strip()[-300:]}")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "check-cuda")
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to check")
        return 1
    statuses()
    memory()
    cli(out)
    print(f"{len(FAILS)} FAIL(s)" + "".join(f"\n  {f}" for f in FAILS))
    return len(FAILS)


if __name__ == "__main__":
    sys.exit(main())
