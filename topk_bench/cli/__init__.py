"""The ``topk-bench`` command line. One module per command; this one wires them and maps errors to exit codes."""

from __future__ import annotations

import os
import shutil
import sys

import typer
import typer.core

from topk_bench.errors import BadInput, file_error

app = typer.Typer(
    name="topk-bench",
    help="Benchmark memory and time of attention implementations (top-k, query chunking, Performer, SDPA).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Command(typer.core.TyperCommand):
    """A command whose help names its arguments plainly: ``SUITE`` and ``[SUITE]`` (typer's default writes
    ``{SUITE}`` in the usage line and ``SUITE <path>`` in the argument list)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, typer.core.TyperArgument):
                param.display_type = lambda ctx: ""  # the help text says what the argument is

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument):
                name = param.metavar or param.name.upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces


def _version(asked: bool) -> None:
    if asked:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"topk-bench {version('topk-bench')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("topk-bench (not installed: no version)")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Benchmark memory and time of attention implementations (top-k, query chunking, Performer, SDPA)."""


def output_width(default: int = 100) -> int:
    """Columns the tables may use: ``COLUMNS`` if set, the terminal's width on a terminal, else ``default``."""
    try:
        return max(40, int(os.environ["COLUMNS"]))
    except (KeyError, ValueError):
        pass
    return shutil.get_terminal_size((default, 24)).columns if sys.stdout.isatty() else default


# Each command module registers itself on ``app`` when imported.
from topk_bench.cli import commands  # noqa: E402,F401 -- registers the commands on app, made above


def main(argv: list[str] | None = None) -> None:
    """Console entry point: bad input, and a file that cannot be read or written (a full disk, a read-only
    place), is one line on stderr and exit code 2, never a traceback."""
    try:
        app(args=argv, prog_name="topk-bench", standalone_mode=True)
    except BadInput as exc:
        _fail(exc)
    except OSError as exc:  # the commands name what they were doing where it helps; the rest still names the file
        _fail(file_error(exc))


def _fail(exc: BadInput) -> None:
    print(f"topk-bench: error: {exc}", file=sys.stderr)
    sys.exit(2)
