"""The ``topk-bench`` command line. One module per command; this one wires them and maps errors to exit codes."""

from __future__ import annotations

import sys

import typer

from topk_bench.errors import BadInput, file_error

app = typer.Typer(
    name="topk-bench",
    help="Benchmark memory and time of attention implementations (top-k, query chunking, Performer, SDPA).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Benchmark memory and time of attention implementations (top-k, query chunking, Performer, SDPA)."""


# Each command module registers itself on ``app`` when imported.
from topk_bench.cli import commands  # noqa: E402,F401


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
