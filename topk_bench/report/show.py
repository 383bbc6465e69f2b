"""``topk-bench show``: results as tables, one per suite — implementation, the parameters that vary, status,
peak memory (GiB), median time (s) and the result columns that have values."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from topk_bench.results.columns import optional_columns, parameter_columns
from topk_bench.results.frame import left_out, load_results
from topk_bench.units import GIB, missing

_LEFT = ("label", "status", "method", "device")


def _cell(value) -> str:
    if missing(value):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def tables(path: str | Path, errors: bool = True) -> list[Table]:
    return _tables(load_results(path), errors)


def _tables(frame, errors: bool) -> list[Table]:
    out = []
    for suite, rows in frame.groupby("suite", sort=False):
        params = [c for c in parameter_columns(rows.columns) if rows[c].nunique(dropna=True) > 1]
        if rows["workload"].nunique() > 1:  # a suite mixing workloads (smoke)
            params.insert(0, "workload")
        optional = [c for c in optional_columns() if c in rows.columns and rows[c].notna().any()]
        table = Table(title=f"{suite} ({len(rows)} rows)")
        for column in ["label", *params, "method", "device", "status", "peak GiB", "median s", "IQR s", *optional]:
            table.add_column(column, justify="left" if column in _LEFT else "right")
        if errors:
            table.add_column("error")
        for _, r in rows.iterrows():
            peak = None if missing(r["peak_bytes"]) else r["peak_bytes"] / GIB
            cells = [r["label"] or r["impl"], *[r[c] for c in params], r["method"], r["device"], r["status"],
                     peak, r["time_median_s"], r["time_iqr_s"], *[r[c] for c in optional]]
            if errors:
                cells.append(str(r["error"])[:80])
            table.add_row(*[_cell(c) for c in cells])
        out.append(table)
    return out


def show(path: str | Path, errors: bool = True, console: Console | None = None,
         warnings: Console | None = None) -> None:
    """The tables on ``console``; on ``warnings`` (stderr), the lines of the files that are not in them."""
    console = console or Console(width=220)
    warnings = warnings or Console(stderr=True)
    frame = load_results(path)
    for table in _tables(frame, errors):
        console.print(table)
    for line in left_out(frame):
        warnings.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)
