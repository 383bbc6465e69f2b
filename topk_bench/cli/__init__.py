"""The ``topk-bench`` command line. One module per command; this one wires them and maps errors to exit codes."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import typer
import typer.core

from topk_bench.errors import BadInput, file_error
from topk_bench.untrusted import shown

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

# click's errors, as the click typer runs on defines them (its own copy in typer >= 0.26): a mistaken option.
_CLICK: dict[str, Any] = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
_UsageError, _ClickException = _CLICK["UsageError"], _CLICK["ClickException"]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: bad input, a mistaken option (``--rounds abc``), and a file that cannot be read or
    written (a full disk, a read-only place), is one line on stderr and exit code 2, never a traceback or a
    usage block; the line's text from files and arguments is escaped for the terminal
    (:func:`topk_bench.untrusted.shown`)."""
    try:
        code = app(args=argv, prog_name="topk-bench", standalone_mode=False)
    except BadInput as exc:
        _fail(str(exc))
    except OSError as exc:  # the commands name what they were doing where it helps; the rest still names the file
        _fail(str(file_error(exc)))
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # no command or no argument: the help is what was asked
            exc.show()
            sys.exit(exc.exit_code)
        command = exc.ctx.command_path if exc.ctx is not None else "topk-bench"
        _fail(f"{exc.format_message()} (see {command} --help)", exc.exit_code)
    except _ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except typer.Abort:  # Ctrl-C at a prompt
        print("Aborted.", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(line: str, code: int = 2) -> None:
    print(f"topk-bench: error: {shown(line)}", file=sys.stderr)
    sys.exit(code)
