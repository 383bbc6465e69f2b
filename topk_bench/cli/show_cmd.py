"""``topk-bench show``: a results CSV (or every CSV of a directory) as a table, memory in GiB, time in seconds."""

from __future__ import annotations

from pathlib import Path

import typer

from topk_bench.cli import app

GIB = 2**30


def _cell(value) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@app.command("show")
def show(
    results: Path = typer.Argument(..., help="A results CSV or a directory of them."),
    errors: bool = typer.Option(True, "--errors/--no-errors", help="Show the error column of failed cases."),
) -> None:
    """One table per suite: implementation, the parameters that vary, status, peak memory (GiB), median time (s)."""
    from rich.console import Console
    from rich.table import Table

    from topk_bench.results import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, load_results

    frame = load_results(results)
    console = Console(width=220)
    for suite, rows in frame.groupby("suite", sort=False):
        params = [c for c in rows.columns if c not in REQUIRED_COLUMNS and c not in OPTIONAL_COLUMNS
                  and rows[c].nunique(dropna=True) > 1]
        if rows["workload"].nunique() > 1:  # a suite mixing workloads (smoke)
            params.insert(0, "workload")
        optional = [c for c in OPTIONAL_COLUMNS if c in rows.columns and rows[c].notna().any()]
        table = Table(title=f"{suite} ({len(rows)} rows)")
        for column in ["label", *params, "method", "device", "status", "peak GiB", "median s", "IQR s", *optional]:
            table.add_column(column, justify="right" if column not in ("label", "status", "method", "device") else "left")
        if errors:
            table.add_column("error")
        for _, r in rows.iterrows():
            peak = r["peak_bytes"] / GIB if r["peak_bytes"] == r["peak_bytes"] else None
            cells = [r["label"] or r["impl"], *[_cell(r[c]) for c in params], r["method"], r["device"], r["status"],
                     _cell(peak), _cell(r["time_median_s"]), _cell(r["time_iqr_s"]), *[_cell(r[c]) for c in optional]]
            if errors:
                cells.append(str(r["error"])[:80])
            table.add_row(*[_cell(c) if not isinstance(c, str) else c for c in cells])
        console.print(table)
