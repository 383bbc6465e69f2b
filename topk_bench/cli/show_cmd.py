"""``topk-bench show``: a results CSV (or every CSV of a directory) as tables that fit the terminal."""

from __future__ import annotations

from pathlib import Path

import typer

from topk_bench.cli import Command, app, output_width


@app.command("show", cls=Command)
def show(
    results: Path = typer.Argument(
        ..., metavar="RESULTS", help="A results CSV or a directory of them (its sub-folders too, each on its own)."
    ),
    wide: bool = typer.Option(
        False, "--wide", help="One row per case with every column (the flat list) instead of the pivot tables."
    ),
    errors: bool = typer.Option(
        True, "--errors/--no-errors", help="With --wide: show the error column of failed cases."
    ),
    crossover: bool = typer.Option(
        False,
        "--crossover",
        help="Instead of the tables: from which length each method beats the dense baseline in time and in memory "
        "(report's crossovers.csv).",
    ),
    baseline: str = typer.Option(
        None, "--baseline", metavar="IMPL", help="With --crossover: the baseline (default: sdpa, else vanilla)."
    ),
    length: str = typer.Option(
        None, "--length", metavar="COLUMN", help="With --crossover: the length (default: seq_len, else kv_len)."
    ),
) -> None:
    """Per suite, device and method: implementations x swept sizes, median time over peak memory (the status
    where a case failed); times measured on a busy machine or with noisy samples are marked *."""
    from topk_bench.report import show as shown_tables  # pandas and rich tables: only when the command runs

    if crossover:
        from rich.console import Console

        shown_tables.show_crossovers(results, baseline, length, Console(width=output_width(shown_tables.DEFAULT_WIDTH)))
        return
    shown_tables.show(results, errors, wide=wide, width=output_width())
