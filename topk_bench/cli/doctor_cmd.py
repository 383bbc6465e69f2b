"""``topk-bench doctor``: checks on this machine that the harness measures what it claims (see topk_bench.doctor)."""

from __future__ import annotations

import typer

from topk_bench.cli import Command, app, output_width
from topk_bench.doctor.isolated import LIMIT_S  # standard library only: --help stays fast


@app.command("doctor", cls=Command)
def doctor(
    device: str = typer.Option(
        "cpu", "--device", metavar="cpu|cuda", help="cpu or cuda (without CUDA here: the CPU checks, and a note)."
    ),
    plugins: list[str] | None = typer.Option(
        None,
        "--plugins",
        metavar="MODULE",
        help="A module or .py file registering implementations to judge too (repeatable).",
    ),
    plugin_seconds: float = typer.Option(
        LIMIT_S,
        "--plugin-seconds",
        min=1.0,
        metavar="S",
        help="How long each plug-in implementation's checks may take, in a process of their own, before they "
        "fail as hanging.",
    ),
) -> None:
    """Check each implementation against an exact reference (float64, float32), measured against predicted
    peak memory, OOM statuses, TF32 off on CUDA and the timer. Exit 0 when all pass, 1 when any fails."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from topk_bench.errors import BadInput
    from topk_bench.types import DeviceKind
    from topk_bench.untrusted import markup, shown, text

    try:
        DeviceKind.of(device)
    except ValueError as exc:
        raise BadInput(str(exc), key="--device") from None
    # torch only once the command runs: --help stays fast.
    import topk_bench.attention
    from topk_bench import plugins as plugin_loader
    from topk_bench.doctor.check import Result, failed
    from topk_bench.doctor.diagnose import diagnose

    built_in = set(topk_bench.attention.names())
    resolved = tuple(plugin_loader.resolve(plugins or [], key="--plugins"))
    theirs = tuple(sorted(set(topk_bench.attention.names()) - built_in))  # user code: judged in a process of its own
    err = Console(stderr=True)
    with err.status("topk-bench doctor: checking ...") as status:
        checks = diagnose(
            device,
            plugins=resolved,
            isolated=theirs,
            progress=lambda c: status.update(f"topk-bench doctor: {markup(c.name)}: {c.result}"),
            plugin_seconds=plugin_seconds,
        )
    table = Table(title=f"topk-bench doctor ({device})")
    table.add_column("check", overflow="fold", ratio=2)
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=5)
    styles = {Result.PASS: "green", Result.FAIL: "bold red", Result.SKIPPED: "yellow"}
    for c in checks:
        # A plug-in names its implementations and writes its errors: text, never markup.
        table.add_row(text(c.name), Text(str(c.result), style=styles[c.result]), text(c.detail))
    console = Console(width=output_width())  # the terminal's, else 100 columns: the table wraps its details
    console.print(table)
    bad = failed(checks)
    if bad:
        console.print(
            shown(f"{len(bad)} of {len(checks)} checks failed: {', '.join(c.name for c in bad)}"),
            highlight=False,
            markup=False,
            emoji=False,
        )
        raise typer.Exit(1)
    console.print(f"all {len(checks)} checks passed ({sum(c.result == Result.SKIPPED for c in checks)} skipped)")
