"""``topk-bench profile``: every byte of a case's peak and, where it is measured, every millisecond."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer

from topk_bench.cli import Command, app, output_width


@app.command("profile", cls=Command)
def profile(
    suite: Path = typer.Argument(..., metavar="SUITE", help="Suite file, e.g. suites/mha.toml."),
    case: list[str] = typer.Option(
        ...,
        "--case",
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="The cases to profile, by their parameters: e.g. impl=vanilla,seq_len=16384 "
        "(keys: impl, label, workload, mode and the results' parameter columns). Repeatable: a case matches "
        'all. A value holding a comma: quoted (label="Top-k fast (size=32, topk=8)"), or whole in a --case '
        "of its own.",
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
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Profile even more cases than max_cases (bench.toml or the suite; default 1000)."
    ),
) -> None:
    """Profile the cases of SUITE that --case picks: DIR/<case_id>/ gets peak.csv (every storage live at the peak:
    bytes, op, source line, shape, dtype, category), timeline.png, profile.json, and where measured ops.csv and
    trace.json (torch.profiler; on CUDA also snapshot.pickle). Prints the peak by source line."""
    from topk_bench.cli.run_cmd import ENDING_SIGNALS, start_template_early, terminate_as_interrupt

    start_template_early(config, None)  # the template imports torch while this process does, to plan
    from rich.console import Console

    from topk_bench.profile import command

    console = Console(width=output_width(160), highlight=False)
    told: list[command.Outcome] = []

    def tell(outcome: command.Outcome) -> None:  # each case as it ends
        command.tell(outcome, console)
        told.append(outcome)

    previous = {sig: signal.signal(sig, terminate_as_interrupt) for sig in ENDING_SIGNALS}
    try:
        outcomes = command.profile(
            suite,
            case,
            predict=predict,
            device=device,
            out=out,
            config=config,
            sets=tuple(sets or ()),
            yes=yes,
            told=tell,
        )
    except KeyboardInterrupt:
        written = sum(o.ok for o in told)
        print(
            f"topk-bench: interrupted: {len(told)} case(s) profiled before ({written} with a profile, told above); "
            "the case running then wrote none",
            file=sys.stderr,
        )
        raise typer.Exit(130) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)
