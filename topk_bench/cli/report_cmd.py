"""``topk-bench report``: results (and a history of them, one folder per commit) as a static site."""

from __future__ import annotations

from pathlib import Path

import typer

from topk_bench.cli import Command, app
from topk_bench.report.steps import STEP_FACTOR


@app.command("report", cls=Command)
def report(
    results: list[Path] = typer.Argument(
        None,
        metavar="RESULTS...",
        help="Results CSVs or folders (their sub-folders too), as `show` and `plot` read them.",
    ),
    out: Path = typer.Option(
        ..., "--out", metavar="DIR", help="The site's folder: new, empty, or one an earlier report wrote."
    ),
    history: Path = typer.Option(
        None,
        "--history",
        metavar="DIR",
        help="A folder of result folders, one per commit (DIR/<n>-<short sha>/: docs/regression.md): each case's "
        "time and peak across them.",
    ),
    baseline: str = typer.Option(
        None,
        "--baseline",
        metavar="IMPL",
        help="The crossovers' baseline (implementation or label); default: sdpa, else vanilla.",
    ),
    length: str = typer.Option(
        None, "--length", metavar="COLUMN", help="The crossovers' length; default: seq_len where swept, else kv_len."
    ),
    commit_url: str = typer.Option(
        None,
        "--commit-url",
        metavar="URL",
        help="Each history point links here, {sha} replaced: https://github.com/ORG/REPO/commit/{sha}.",
    ),
    relative_to: str = typer.Option(
        None,
        "--relative-to",
        metavar="IMPL",
        help="The history's times as multiples of IMPL's in the same run (as `compare --relative-to`): what a "
        "shared machine does to both divides out.",
    ),
    step_factor: float = typer.Option(
        STEP_FACTOR,
        "--step-factor",
        metavar="F",
        help="A history step: a level that moved by more than this, either way, and stayed.",
    ),
) -> None:
    """A static site (index.html, its style sheet, SVG figures and CSVs; no script, nothing from the network):
    per suite, device and method, the tables of `show`, the figures of `plot`, the trust flags, provenance,
    roofline fractions and the crossover lengths against the dense baseline; with --history, each case's
    series over the commits, its steps and the time gate's verdicts."""
    from topk_bench.errors import BadInput
    from topk_bench.report.site.build import Options, build  # pandas, matplotlib, jinja2: only when it runs
    from topk_bench.untrusted import shown

    if not (step_factor > 1 and step_factor < 100):
        raise BadInput(f"expected a factor above 1, got {step_factor}", key="--step-factor")
    index = build(
        list(results or []),
        out,
        history,
        Options(baseline, length, commit_url, step_factor, relative_to),
        warn=lambda line: typer.echo(shown(f"warning: {line}"), err=True),
    )
    typer.echo(shown(index))
