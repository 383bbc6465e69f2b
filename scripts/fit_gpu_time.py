"""Fit the GPU time model's global constants on part of the committed H100 rows, judge it on the rest.

    .venv/bin/python scripts/fit_gpu_time.py            # fit, print the table of every row, write nothing
    .venv/bin/python scripts/fit_gpu_time.py --write    # ... and write topk_bench/predict/gpu_time.json

Every measured ``ok`` row of tests/data (the H100 80GB HBM3 of 2026-11-23 and 2026-11-26) is matched to its case
(the suite it was measured from, planned as ``--predict --device cuda --gpu h100-sxm`` and turned back into the
measured case: the same ``case_id``); each case is predicted once under FakeTensor, and its kernels reduce to
(launches, roofline seconds per kernel class): the constants enter the time linearly, so the fit is cheap.

The split is by case, never by row (a case measured twice is on one side only): the cases, ordered by workload,
implementation, size and dtype, alternate between fit and held out, so both sides span every method and size.
The constants (one efficiency per kernel class, the kernel floor, the launch cost) minimise the squared
log-ratio of predicted to measured time over the fitted rows (``scipy.optimize.least_squares``, in log space:
every constant stays positive); nothing depends on a case or an implementation.
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

from topk_bench.predict import backends, kernels, timing
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
    launches: int = 0
    roofline: tuple[float, ...] = ()  # seconds per kernel class (timing.CLASSES), before efficiency
    fit: bool = False

    def predicted(self, constants: timing.Constants) -> float:
        device = self.launches * constants.floor_s + sum(
            r / constants.efficiency[c] for c, r in zip(timing.CLASSES, self.roofline)
        )
        return device if self.graph else max(device, self.launches * constants.launch_s)


def matched_rows() -> list[Row]:
    rows: list[Row] = []
    predicted: dict[str, tuple[int, tuple[float, ...]]] = {}
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
            if case.case_id not in predicted:
                predicted[case.case_id] = _kernels(case)
            launches, roofline = predicted[case.case_id]
            rows.append(
                Row(
                    source,
                    twin.case_id,
                    name,
                    (row["workload"], row["label"] or row["impl"], size, row["dtype"]),
                    float(row["time_median_s"]),
                    row.get("timer") == Timer.CUDAGRAPH,
                    launches,
                    roofline,
                )
            )
            print(f"  {source}: {name}", file=sys.stderr)
    return rows


def _kernels(case) -> tuple[int, tuple[float, ...]]:
    recorded: list[timing.KernelCosts] = []

    def make_costs() -> timing.KernelCosts:
        recorded.append(timing.KernelCosts())
        return recorded[-1]

    backends.predict_cuda(case, make_costs=make_costs)
    found = recorded[0].kernels
    roofline = {c: 0.0 for c in timing.CLASSES}
    unit = timing.Constants(dict.fromkeys(timing.CLASSES, 1.0), 0.0, 0.0)
    for k in found:
        roofline[k.kind] += timing.kernel_seconds(k, GPU, unit)
    return len(found), tuple(roofline[c] for c in timing.CLASSES)


def split(rows: list[Row]) -> None:
    """Cases in order of workload, implementation, size and dtype alternate between fit and held out."""
    cases = sorted({(r.order, r.case_id) for r in rows})
    fitted = {case_id for i, (_, case_id) in enumerate(cases) if i % 2 == 0}
    for r in rows:
        r.fit = r.case_id in fitted


NAMES = (*timing.CLASSES, "floor_s", "launch_s")


def constants_of(x: np.ndarray) -> timing.Constants:
    values = np.exp(x)
    return timing.Constants(dict(zip(timing.CLASSES, values[: len(timing.CLASSES)])), values[-2], values[-1])


def fit(rows: list[Row]) -> timing.Constants:
    used = [r for r in rows if r.fit]
    start = np.log([0.5] * len(timing.CLASSES) + [3e-6, 1e-5])
    # An efficiency is a fraction of the peak (at most 1); the floor and the launch cost within what a GPU and a
    # host can do (0.5 to 20 microseconds, 1 to 100).
    low = np.log([1e-3] * len(timing.CLASSES) + [5e-7, 1e-6])
    high = np.log([1.0] * len(timing.CLASSES) + [2e-5, 1e-4])

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

    return {"fit": stats([r for r in rows if r.fit]), "held_out": stats([r for r in rows if not r.fit])}


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
            "floor_s": float(f"{constants.floor_s:.4g}"),
            "launch_s": float(f"{constants.launch_s:.4g}"),
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
