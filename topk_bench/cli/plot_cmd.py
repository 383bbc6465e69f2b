"""``topk-bench plot``: render the paper-style figures of a results directory."""

from __future__ import annotations

from pathlib import Path

import typer

from topk_bench.cli import Command, app


@app.command("plot", cls=Command)
def plot(
    results_dir: Path = typer.Argument(
        ...,
        metavar="RESULTS",
        help="Directory of results CSVs (OUT of `topk-bench run`), or one "
        "CSV; a directory's sub-folders too, each drawn into the same sub-folder of --out.",
    ),
    out: Path = typer.Option(Path("plots"), "--out", metavar="DIR", help="Where to write the figures."),
    format: str = typer.Option(
        "png", "--format", metavar="png,pdf,svg", help="Comma-separated file formats: png, pdf, svg."
    ),
    memory: str = typer.Option(
        None,
        "--memory",
        metavar="allocated|reserved",
        help="Which peak the memory row draws: allocated or reserved "
        "(CUDA rows; the paper's metric). Default: each suite's [plot] memory.",
    ),
) -> None:
    """One figure per suite CSV and (device, method), named <suite>-<device>-<method>.<fmt>; with [plot] pareto,
    also quality against time: <suite>-pareto-<device>-<method>.<fmt>."""
    # Imported here so that `topk-bench --help` and other commands do not pay for matplotlib.
    from topk_bench.report.plots.figure import NotDrawn, parse_formats, plot_results
    from topk_bench.untrusted import shown

    try:
        written = plot_results(
            results_dir,
            out,
            parse_formats(format),
            warn=lambda line: typer.echo(shown(f"warning: {line}"), err=True),
            memory=memory,
        )
    except NotDrawn as exc:  # the other figures are drawn: listed, then each that is not, and exit 1
        for path in exc.written:
            typer.echo(shown(path))
        for line in exc.failures:
            typer.echo(shown(f"error: {line}"), err=True)
        raise typer.Exit(1) from None
    for path in written:
        typer.echo(shown(path))
