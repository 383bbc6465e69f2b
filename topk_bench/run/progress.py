"""What a run shows while it goes (a rich progress bar, or one line per case when not on a terminal) and at the end."""

from __future__ import annotations

import collections
import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from topk_bench.results import columns as col
from topk_bench.status import Status
from topk_bench.units import short_bytes, short_seconds
from topk_bench.untrusted import markup

# Rows written without running anything: they say nothing of how long a case takes.
_INSTANT = frozenset({Status.SKIPPED, Status.UNSUPPORTED})


class Eta:
    """Time left in a run, from the seconds per case so far, moving while a case runs.

    With ``n`` cases run in ``T`` seconds (wall, parallel jobs included), ``R``
    cases left and the latest ending ``s`` seconds ago: ``R T/n - s``, counting
    down through the average case, but never below ``(R - 1)(T + s)/(n + 1)``,
    what is left if a case ended now. So a long case first uses up its expected
    time, then pushes the estimate up, instead of freezing it (rich's own column
    changes only when a case ends).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = clock()
        self.last = self.start
        self.ran = 0

    def ended(self, ran: bool = True) -> None:
        """A case ended; ``ran=False`` for a row written without running (skipped, unsupported)."""
        if ran:
            self.ran += 1
            self.last = self.clock()

    def seconds_left(self, left: int) -> float | None:
        """Seconds until ``left`` more cases end; None before any case ran."""
        if left <= 0:
            return 0.0
        if not self.ran:
            return None
        per_case = (self.last - self.start) / self.ran
        since = self.clock() - self.last
        return max(left * per_case - since, (left - 1) * (self.last - self.start + since) / (self.ran + 1))


class _EtaColumn(ProgressColumn):
    def __init__(self, reporter: Reporter):
        super().__init__()
        self.reporter = reporter

    def render(self, task) -> Text:
        left = self.reporter.eta.seconds_left(self.reporter.total - self.reporter.done)
        shown = "-:--:--" if left is None else str(datetime.timedelta(seconds=round(left)))
        return Text(shown, style="progress.remaining")


class Reporter:
    """Progress of one suite: ``total`` cases of which ``done`` were already in the CSV."""

    def __init__(self, suite: str, total: int, done: int, *, enabled: bool = True, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        self.total, self.done, self.suite = total, done, suite
        self.eta = Eta()
        self._progress: Progress | None = None
        self._task: TaskID | None = None  # set with _progress

    def __enter__(self) -> Reporter:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.fields[suite]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TextColumn("elapsed"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                _EtaColumn(self),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total, completed=self.done, suite=self.suite)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def note(self, message: str) -> None:
        if self.enabled or message.startswith("warning:"):  # a warning is said however quiet the run
            self.console.print(message, highlight=False, markup=False)

    def running(self, what: str) -> None:
        """What runs now (implementation and size)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=markup(what))  # a label of the suite: text

    def waiting(self, line: str) -> None:
        """How the cases do on an executor where they wait (``slurm: 3 pending (Resources), 1 running``):
        the bar's description on a terminal, else a line of its own."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=markup(line))
        elif self.enabled:
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def finished(self, what: str, row: Mapping[str, Any]) -> None:
        self.done += 1
        status = row.get(col.STATUS, "")
        self.eta.ended(ran=status not in _INSTANT)
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)
        detail = row.get(col.ERROR) or ""
        line = (
            f"[{self.done}/{self.total}] {what}: {status}  peak {short_bytes(row.get(col.PEAK_BYTES))}"
            f"  time {short_seconds(row.get(col.TIME_MEDIAN_S))}"
            + (f" [{row['trust']}]" if row.get(col.TRUST) else "")
            + (f"  ({detail[:120]})" if detail else "")
        )
        if self._progress is not None:
            self._progress.console.print(line, highlight=False, markup=False)
        elif self.enabled:
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def summary(
    suite: str,
    csv_path: Path,
    written: collections.Counter,
    in_file: collections.Counter,
    elapsed_s: float,
    console: Console | None = None,
    notes: Sequence[str] = (),
) -> None:
    """Status counts of this run and of the whole file, where the results went, then ``notes`` (one line each)."""
    console = console or Console()
    table = Table(title=f"{suite}: {sum(written.values())} case(s) in {elapsed_s:.1f} s")
    table.add_column(col.STATUS)
    table.add_column("this run", justify="right")
    table.add_column("in file", justify="right")
    for status in sorted(set(written) | set(in_file)):
        table.add_row(status, str(written.get(status, 0)), str(in_file.get(status, 0)))
    console.print(table)
    console.print(f"results: {csv_path}", highlight=False, soft_wrap=True)
    for note in notes:
        console.print(note, highlight=False, markup=False, soft_wrap=True)
