"""``topk-bench compare BASE NEW``: exit 0 when nothing regressed, 1 on a regression, 2 on bad input."""

from __future__ import annotations

from pathlib import Path

import typer

from topk_bench.cli import Command, app
from topk_bench.report.thresholds import Thresholds

DEFAULTS = Thresholds()


@app.command("compare", cls=Command)
def compare(
    base: Path = typer.Argument(..., metavar="BASE", help="Baseline results: a CSV file or a results directory."),
    new: Path = typer.Argument(..., metavar="NEW", help="New results: a CSV file or a results directory."),
    time_factor: float = typer.Option(
        DEFAULTS.time_factor, metavar="F", help="Median time ratio above which a significant change counts."
    ),
    memory_factor: float = typer.Option(
        DEFAULTS.memory_factor, metavar="F", help="Peak memory ratio above which a case regressed."
    ),
    reserved_factor: float = typer.Option(
        DEFAULTS.reserved_factor, metavar="F", help="Reserved memory ratio (CUDA) above which a case regressed."
    ),
    alpha: float = typer.Option(
        DEFAULTS.alpha, metavar="A", help="Mann-Whitney U significance level for time changes."
    ),
    markdown: Path = typer.Option(
        None, "--markdown", metavar="FILE", help="Also write a Markdown summary (pull-request comment) here."
    ),
    json_file: Path = typer.Option(
        None, "--json", metavar="FILE", help="Also write github-action-benchmark customSmallerIsBetter JSON here."
    ),
    allow_missing: bool = typer.Option(
        False,
        "--allow-missing",
        help="Pass even when cases of BASE are missing from NEW (a suite that lost cases on purpose).",
    ),
    relative_to: str | None = typer.Option(
        None,
        "--relative-to",
        metavar="IMPL",
        help="Judge each case's time as a multiple of IMPL's (an implementation or a label) at the same parameters "
        "in the same file, round by round with rounds: for shared CI runners and machines whose speed drifts.",
    ),
    pair_by: str | None = typer.Option(
        None,
        "--pair-by",
        metavar="COLUMNS",
        help="Pair the cases of BASE and NEW by these columns (comma-separated, e.g. impl,seq_len) instead of "
        "their case_id: an A/B of an option (chunk_size, compile, a plug-in's own), the difference said.",
    ),
    allow_no_base: bool = typer.Option(
        False,
        "--allow-no-base",
        help="BASE may not exist yet (the first run of main): then say so, export NEW (--json, --markdown) and "
        "judge nothing.",
    ),
) -> None:
    """Compare two runs case by case: memory, time (median ratio + Mann-Whitney U) and status.

    Exit 1 on a regression, and when the gate cannot vouch for NEW: nothing compared, a case of BASE
    missing from NEW, a line of either side left out as invalid, a value that is not a finite number >= 0.
    A predicted run against a measured one is no gate: each case's predicted and measured time and peak, and
    how far apart they are (exit 0)."""
    from rich.console import Console

    from topk_bench.report import compare as cmp  # pandas and scipy: only when the command runs
    from topk_bench.report import compare_render as report
    from topk_bench.report import pairing, predicted_vs_measured

    thresholds = Thresholds(time_factor, memory_factor, reserved_factor, alpha).validate()
    if allow_no_base and not base.exists() and not base.is_symlink():
        new_frame = cmp.load(new)
        result = cmp.first_run(new_frame, thresholds, str(base), str(new), relative_to)
    else:
        base_frame, new_frame = cmp.load(base), cmp.load(new)
        if predicted_vs_measured.applies(base_frame, new_frame):  # how far a prediction is: no gate to judge
            for line in predicted_vs_measured.lines(predicted_vs_measured.pairs(base_frame, new_frame)):
                typer.echo(line)
            raise typer.Exit(0)
        by = pairing.parse(pair_by) if pair_by is not None else None
        result = cmp.compare_frames(
            base_frame, new_frame, thresholds, str(base), str(new), allow_missing, by, relative_to=relative_to
        )
    report.print_rich(result, Console(width=160))
    if markdown is not None:
        report.write_markdown(markdown, result)
    if json_file is not None:
        report.write_json(json_file, new_frame, result)
    raise typer.Exit(result.exit_code)
