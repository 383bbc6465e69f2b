"""What a run shows while it goes (a rich progress bar, or one line per case when not on a terminal) and at the end."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from topk_bench.units import GIB, missing


def _gib(value: Any) -> str:
    return "-" if missing(value) else f"{float(value) / GIB:.3f} GiB"


def _seconds(value: Any) -> str:
    return "-" if missing(value) else f"{float(value):.4g} s"


class Reporter:
    """Progress of one suite: ``total`` cases of which ``done`` were already in the CSV."""

    def __init__(self, suite: str, total: int, done: int, *, enabled: bool = True, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        self.total, self.done, self.suite = total, done, suite
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> "Reporter":
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.fields[suite]}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.description}"), TextColumn("elapsed"), TimeElapsedColumn(),
                TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total, completed=self.done, suite=self.suite)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def note(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, highlight=False, markup=False)

    def running(self, what: str) -> None:
        """What runs now (implementation and size)."""
        if self._progress is not None:
            self._progress.update(self._task, description=what)

    def finished(self, what: str, row: Mapping[str, Any]) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress.advance(self._task)
        status = row.get("status", "")
        detail = row.get("error") or ""
        line = (f"[{self.done}/{self.total}] {what}: {status}  peak {_gib(row.get('peak_bytes'))}"
                f"  time {_seconds(row.get('time_median_s'))}" + (f"  ({detail[:120]})" if detail else ""))
        if self._progress is not None:
            self._progress.console.print(line, highlight=False, markup=False)
        elif self.enabled:
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def summary(suite: str, csv_path: Path, written: collections.Counter, in_file: collections.Counter,
            elapsed_s: float, console: Console | None = None) -> None:
    """Status counts of this run and of the whole file, and where the results went."""
    console = console or Console()
    table = Table(title=f"{suite}: {sum(written.values())} case(s) in {elapsed_s:.1f} s")
    table.add_column("status")
    table.add_column("this run", justify="right")
    table.add_column("in file", justify="right")
    for status in sorted(set(written) | set(in_file)):
        table.add_row(status, str(written.get(status, 0)), str(in_file.get(status, 0)))
    console.print(table)
    console.print(f"results: {csv_path}", highlight=False, soft_wrap=True)
