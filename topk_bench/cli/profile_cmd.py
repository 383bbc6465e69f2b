"""``topk-bench profile``: every byte of a case's peak and, where it is measured, every millisecond."""

from __future__ import annotations

from pathlib import Path

import typer

from topk_bench.cli import Command, app, output_width


@app.command("profile", cls=Command)
def profile(
    suite: Path = typer.Argument(..., metavar="SUITE", help="Suite file, e.g. suites/mha.toml."),
    case: str = typer.Option(
        ...,
        "--case",
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="The cases to profile, by their parameters: e.g. impl=vanilla,seq_len=16384 "
        "(keys: impl, label, workload, mode and the results' parameter columns).",
    ),
    predict: bool = typer.Option(
        False,
        "--predict",
        help="Predict under FakeTensorMode (any size, no time): the peak's storages without running the compute.",
    ),
    device: str | None = typer.Option(None, "--device", metavar="cpu|cuda", help="cpu | cuda (default: bench.toml's)."),
    out: Path | None = typer.Option(
        None,
        "--out",
        metavar="DIR",
        help="Where profiles go, one directory per case (default: results_dir of bench.toml, then profile/).",
    ),
    sets: list[str] | None = typer.Option(
        None,
        "--set",
        metavar="KEY=VALUES",
        help="Replace the suite's values of a key (repeatable), as `run --set`: e.g. seq_len=131072, topk=64.",
    ),
    config: Path | None = typer.Option(
        None, "--config", metavar="FILE", help="bench.toml to use (default: ./bench.toml if present)."
    ),
) -> None:
    """Profile the cases of SUITE that --case picks: DIR/<case_id>/ gets peak.csv (every storage live at the peak:
    bytes, op, source line, shape, dtype, category), timeline.png, profile.json, and where measured ops.csv and
    trace.json (torch.profiler; on CUDA also snapshot.pickle). Prints the peak by source line."""
    from topk_bench.cli.run_cmd import start_template_early

    start_template_early(config, None)  # the template imports torch while this process does, to plan
    from rich.console import Console

    from topk_bench.profile import command

    outcomes = command.profile(
        suite, case, predict=predict, device=device, out=out, config=config, sets=tuple(sets or ())
    )
    console = Console(width=output_width(160), highlight=False)
    for outcome in outcomes:
        command.tell(outcome, console)
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)
