"""Fit the GPU time model's global constants on part of the committed H100 rows, judge it on the rest.

    .venv/bin/python scripts/fit_gpu_time.py            # fit, print the table of every row, write nothing
    .venv/bin/python scripts/fit_gpu_time.py --write    # ... and write topk_bench/predict/gpu_time.json

Every measured ``ok`` row of tests/data (the H100 80GB HBM3 of 2026-11-23 and 2026-11-26) is matched to its case
(the suite it was measured from, planned as ``--predict --device cuda --gpu h100-sxm`` and turned back into the
measured case: the same ``case_id``); each case is predicted once under FakeTensor, and its kernels are kept as a
:class:`topk_bench.predict.timing.KernelTable` (FLOPs, bytes, blocks, lanes, ops dispatched before each), which
the fit costs under each candidate set of constants with the model's own functions.

The split is by case, never by row (a case measured twice, or from two suites, is on one side only), and within
each group of the accuracy table (layers; decode steps in float32, eager; decode steps in bfloat16, CUDA graphs):
a group's cases, ordered by workload, implementation, size and dtype, alternate between fit and held out, the
first fitted, so both sides span every method, size and timer. The constants (:data:`PARAMETERS`: an efficiency
per kernel class, one for attention's forward and backward; the bandwidth one block of a GEMM or of an attention
kernel streams; the bandwidth of one thread walking a chain of loads; the kernel floor; the host's cost per op and
per launch) minimise the squared log-ratio of predicted to measured time over the fitted rows
(``scipy.optimize.least_squares``, in log space within bounds); nothing depends on a case or an implementation.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from topk_bench.aten_ops import KernelClass
from topk_bench.predict import as_measured, backends, kernels, timing
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags
from topk_bench.types import GpuModel, Method, Timer

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
# (measured rows, the suite they were measured from, what was given on the command line)
SOURCES = (
    ("h100-ci.csv", "suites/ci.toml", {}),
    ("h100-2026-11-26/ci.csv", "suites/ci.toml", {}),
    ("h100-2026-11-26/mha.csv", "suites/mha.toml", {}),
    ("h100-2026-11-26/topk_fast_cuda-float32.csv", "suites/topk_fast_cuda.toml", {}),
    ("h100-2026-11-26/kv_targets-cudagraph.csv", "suites/kv_targets.toml", {"timer": Timer.CUDAGRAPH}),
)
GPU = kernels.gpu(GpuModel.H100_SXM)
SIZE_KEYS = ("seq_len", "kv_len")


@dataclass
class Row:
    source: str
    case_id: str
    name: str  # workload/impl size dtype
    order: tuple
    measured_s: float
    graph: bool  # timed as a CUDA graph's replay: the device time alone
    group: str  # the row of the accuracy table it counts in
    table: timing.KernelTable | None = None
    fit: bool = False

    def predicted(self, constants: timing.Constants) -> float:
        assert self.table is not None
        device = timing.device_seconds(self.table, GPU, constants)
        if self.graph:
            return float(device.sum())
        return timing.stream_seconds(device, timing.host_seconds(self.table, constants))


def group_of(workload: str, dtype: str, graph: bool) -> str:
    """The accuracy table's groups: what the model gets right or wrong for different reasons."""
    if workload != "decode":
        return f"layers, {dtype}, {'CUDA graph' if graph else 'eager'}"
    return f"decode steps, {dtype}, {'CUDA graph' if graph else 'eager'}"


def matched_rows() -> list[Row]:
    rows: list[Row] = []
    predicted: dict[tuple, timing.KernelTable] = {}
    for source, suite, given in SOURCES:
        measured = {r["case_id"]: r for r in csv.DictReader((DATA / source).open()) if r["status"] == "ok"}
        cases = plan(ROOT / suite, Flags(predict=True, device="cuda"), yes=True).cases
        for case in cases:
            twin = replace(case, method=Method.MEASURED, gpu=None, **given)
            row = measured.get(twin.case_id)
            if row is None:
                continue
            size = next((int(float(row[k])) for k in SIZE_KEYS if row.get(k)), 0)
            name = f"{row['workload']}/{row['label'] or row['impl']} {size} {row['dtype']}"
            ran = (case.case_id, tuple(sorted(as_measured.environment(row).items())))  # a case, on its code path
            if ran not in predicted:
                predicted[ran] = _kernels(case, row)
            graph = row.get("timer") == Timer.CUDAGRAPH
            rows.append(
                Row(
                    source,
                    twin.case_id,
                    name,
                    (row["workload"], row["label"] or row["impl"], size, row["dtype"]),
                    float(row["time_median_s"]),
                    graph,
                    group_of(row["workload"], row["dtype"], graph),
                    predicted[ran],
                )
            )
            print(f"  {source}: {name}", file=sys.stderr)
    return rows


def _kernels(case, row: dict[str, str]) -> timing.KernelTable:
    recorded: list[timing.KernelCosts] = []

    def make_costs() -> timing.KernelCosts:
        recorded.append(timing.KernelCosts())
        return recorded[-1]

    # Each committed row is predicted on the code it ran (its code_path; the torch path of its day for rows
    # without one), whatever the Triton kernels and the CUDA torch path have become since.
    with as_measured.ran_as_measured(row):
        backends.predict_cuda(case, make_costs=make_costs)
    return timing.KernelTable.of(recorded[0].kernels, GPU)


def split(rows: list[Row]) -> None:
    """Within each group of the accuracy table, its cases in order of workload, implementation, size and dtype
    alternate between fit and held out (the first fitted): every group has rows on both sides. A case is what it
    computes, not its ``case_id``: mha at 2,048 tokens measured from ci.toml and from mha.toml (two suites, two
    ids) is one case, on one side."""
    fitted: set[tuple] = set()
    for group in sorted({r.group for r in rows}):
        cases = sorted({r.order for r in rows if r.group == group})
        fitted |= {order for i, order in enumerate(cases) if i % 2 == 0}
    for r in rows:
        r.fit = r.order in fitted


# The constants, in the fit's vector: (name, start, low, high). An efficiency is a fraction of the peak (at most
# 1); what one block streams, from a crawl to the part's bandwidth; what one thread walking a chain of loads
# reads (0.1 MB/s to 1 GB/s: a dependent load takes about a microsecond). The floor, a kernel's least time on
# the device, is what an empty kernel takes on an H100 in a stream (1 to 5 microseconds): left free (to 20), the
# fit put it at 12, the eager rows' host time that no op count explains leaking into every kernel. The host's
# costs within what a host can do: a launch 1 to 100 microseconds, any op dispatched 0.1 to 50.
# One efficiency per kernel class, but one for a fused attention kernel's forward and backward (their FLOPs already
# count the backward's extra products): fitted apart, the backward's ran to its bound (1.0), the float32 layers'
# rows telling the two apart no better than by the host's noise, and bf16 training was predicted at the tensor
# cores' full peak.
EFFICIENCIES = {
    "gemm": (KernelClass.GEMM,),
    "attention": (KernelClass.ATTENTION_FWD, KernelClass.ATTENTION_BWD),
    "elementwise": (KernelClass.ELEMENTWISE,),
    "selection": (KernelClass.SELECTION,),
    "indexing": (KernelClass.INDEXING,),
}
PARAMETERS = (
    *((f"efficiency.{e}", 0.5, 1e-3, 1.0) for e in EFFICIENCIES),
    *((f"block_bytes_per_s.{g}", 50e9, 1e9, GPU.hbm_bytes_per_s) for g in timing.BlockGroup),
    ("lane_bytes_per_s", 1e7, 1e5, 1e9),
    ("floor_s", 3e-6, 1e-6, 5e-6),
    ("launch_s", 1e-5, 1e-6, 1e-4),
    ("op_s", 2e-6, 1e-7, 5e-5),
)


def constants_of(x: np.ndarray) -> timing.Constants:
    values = dict(zip((p[0] for p in PARAMETERS), np.exp(x)))
    return timing.Constants(
        efficiency={c: float(values[f"efficiency.{e}"]) for e, classes in EFFICIENCIES.items() for c in classes},
        block_bytes_per_s={g: float(values[f"block_bytes_per_s.{g}"]) for g in timing.BlockGroup},
        **{name: float(values[name]) for name in ("lane_bytes_per_s", "floor_s", "launch_s", "op_s")},
    )


def fit(rows: list[Row]) -> timing.Constants:
    used = [r for r in rows if r.fit]
    start, low, high = (np.log([p[i] for p in PARAMETERS]) for i in (1, 2, 3))

    def residuals(x: np.ndarray) -> np.ndarray:
        c = constants_of(x)
        return np.array([math.log(r.predicted(c) / r.measured_s) for r in used])

    return constants_of(least_squares(residuals, start, bounds=(low, high)).x)


def summary(rows: list[Row], c: timing.Constants) -> dict:
    def stats(part: list[Row]) -> dict:
        errors = [abs(r.predicted(c) / r.measured_s - 1) for r in part]
        ratios = [r.predicted(c) / r.measured_s for r in part]
        return {
            "rows": len(part),
            "median_abs_error": round(statistics.median(errors), 4) if part else None,
            "within_2x": int(sum(0.5 <= q <= 2 for q in ratios)),
            "worst_ratio": round(max(ratios, key=lambda q: abs(math.log(q))), 3) if part else None,
        }

    out = {"fit": stats([r for r in rows if r.fit]), "held_out": stats([r for r in rows if not r.fit])}
    out["groups"] = {
        g: {side: stats([r for r in rows if r.group == g and r.fit == fit]) for side, fit in SIDES}
        for g in sorted({r.group for r in rows})
    }
    return out


SIDES = (("fit", True), ("held_out", False))


def table(rows: list[Row], c: timing.Constants) -> str:
    lines = [
        "| row | source | timer | measured | predicted | pred/meas | side |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in sorted(rows, key=lambda r: (r.order, r.source)):
        p = r.predicted(c)
        lines.append(
            f"| {r.name} | {r.source} | {'cudagraph' if r.graph else 'events'} | {r.measured_s * 1e3:.3f} ms | "
            f"{p * 1e3:.3f} ms | {p / r.measured_s:.2f} | {'fit' if r.fit else 'held out'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {timing.FITTED.relative_to(ROOT)}")
    args = parser.parse_args()
    rows = matched_rows()
    split(rows)
    constants = fit(rows)
    print(table(rows, constants))
    result = {
        "gpu": GPU.key.value,
        "constants": {
            "efficiency": {k: round(float(v), 5) for k, v in constants.efficiency.items()},
            "block_bytes_per_s": {k: float(f"{v:.4g}") for k, v in constants.block_bytes_per_s.items()},
            "lane_bytes_per_s": float(f"{constants.lane_bytes_per_s:.4g}"),
            "floor_s": float(f"{constants.floor_s:.4g}"),
            "launch_s": float(f"{constants.launch_s:.4g}"),
            "op_s": float(f"{constants.op_s:.4g}"),
        },
        "accuracy": summary(rows, constants),
        "fitted_cases": sorted({r.case_id for r in rows if r.fit}),
        "held_out_cases": sorted({r.case_id for r in rows if not r.fit}),
        "by": "scripts/fit_gpu_time.py",
    }
    print(json.dumps({k: result[k] for k in ("constants", "accuracy")}, indent=2))
    if args.write:
        timing.FITTED.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {timing.FITTED}", file=sys.stderr)


if __name__ == "__main__":
    main()
