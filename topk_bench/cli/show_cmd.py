"""``topk-bench show``: a results CSV (or every CSV of a directory) as a table, memory in GiB, time in seconds."""

from __future__ import annotations

from pathlib import Path

import typer

from topk_bench.cli import app


@app.command("show")
def show(
    results: Path = typer.Argument(..., help="A results CSV or a directory of them."),
    errors: bool = typer.Option(True, "--errors/--no-errors", help="Show the error column of failed cases."),
) -> None:
    """One table per suite: implementation, the parameters that vary, status, peak memory (GiB), median time (s)."""
    from topk_bench.report.show import show as show_results  # pandas and rich tables: only when the command runs

    show_results(results, errors)
