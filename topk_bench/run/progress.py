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
from topk_bench.units import format_duration, missing, short_bytes, short_seconds, wrapped
from topk_bench.untrusted import markup, shown

# Rows written without running anything: they say nothing of how long a case takes.
_INSTANT = frozenset({Status.SKIPPED, Status.UNSUPPORTED})


class Eta:
    """Time left in a run: what the estimate expects of the cases left (:mod:`topk_bench.run.estimate`), scaled
    by what the cases done took against what it expected of them, shared by the job slots; moving while a case
    runs.

    With ``W`` seconds of work left by the estimate, ``k`` = taken / expected of the cases done, ``J`` slots and
    the latest case ending ``s`` seconds ago: ``k W / J - s``, counting down through the cases that run, but
    never below ``k (W - w) / J``, what is left if the largest case left (``w``) ended now. So a long case first
    uses up its expected time, then holds the estimate up, instead of freezing it (rich's own column changes
    only when a case ends). Before any case ended, ``k`` is 1: the estimate itself.
    """

    def __init__(
        self,
        expected: Mapping[str, float] | None = None,
        *,
        slots: int = 1,
        rounds: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.clock = clock
        self.last = clock()
        self.slots, self.rounds = max(1, slots), max(1, rounds)
        self.expected = dict(expected or {})  # case_id -> seconds of one round, by the estimate
        self.left = dict(self.expected)  # the cases not ended yet
        self.took = 0.0  # seconds the cases done took (their rows' wall_s)
        self.foreseen = 0.0  # what the estimate expected of those

    def ended(self, case_id: object = None, wall_s: object = None, *, ran: bool = True) -> None:
        """A case ended, its child having taken ``wall_s`` seconds (a round); ``ran=False`` for a row written
        without running (skipped, unsupported): it says nothing of how long a case takes."""
        expected = self.left.pop(str(case_id), None)
        if not ran:
            return
        self.last = self.clock()
        if expected is not None and isinstance(wall_s, (int, float)) and not missing(wall_s) and expected > 0:
            self.took += float(wall_s)
            self.foreseen += expected

    @property
    def scale(self) -> float:
        """Taken over expected, of the cases done (1 before any)."""
        return self.took / self.foreseen if self.foreseen > 0 else 1.0

    def seconds_left(self) -> float | None:
        """Seconds until the cases left end; None without an estimate."""
        if not self.expected:
            return None
        if not self.left:
            return 0.0
        work = self.scale * self.rounds * sum(self.left.values()) / self.slots
        since = self.clock() - self.last
        floor = work - self.scale * self.rounds * max(self.left.values()) / self.slots
        return max(work - since, floor, 0.0)


class _EtaColumn(ProgressColumn):
    def __init__(self, reporter: Reporter):
        super().__init__()
        self.reporter = reporter

    def render(self, task) -> Text:
        left = self.reporter.eta.seconds_left()
        shown = "-:--:--" if left is None else str(datetime.timedelta(seconds=round(left)))
        return Text(shown, style="progress.remaining")


class Reporter:
    """Progress of one suite: ``total`` cases of which ``done`` were already in the CSV."""

    def __init__(
        self,
        suite: str,
        total: int,
        done: int,
        *,
        enabled: bool = True,
        console: Console | None = None,
        eta: Eta | None = None,
    ):
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        self.total, self.done, self.suite = total, done, suite
        self.eta = eta or Eta()
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
            say(self.console, message)

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
            say(self.console, line)

    def finished(self, what: str, row: Mapping[str, Any]) -> None:
        self.done += 1
        status = row.get(col.STATUS, "")
        self.eta.ended(row.get(col.CASE_ID), row.get(col.WALL_S), ran=status not in _INSTANT)
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)
        detail = row.get(col.ERROR) or ""
        predicted = row.get(col.TIME_PREDICTED_S)  # a CUDA prediction's time: the time model's, said so
        time = (
            f"~{short_seconds(predicted)} predicted"
            if predicted is not None
            else short_seconds(row.get(col.TIME_MEDIAN_S))
        )
        line = (
            f"[{self.done}/{self.total}] {what}: {status}  peak {short_bytes(row.get(col.PEAK_BYTES))}"
            f"  time {time}"
            + (f" [{row['trust']}]" if row.get(col.TRUST) else "")
            + (f"  ({detail[:120]})" if detail else "")
        )
        if self._progress is not None:
            say(self._progress.console, line)
        elif self.enabled:
            say(self.console, line)


def say(console: Console, line: str) -> None:
    """One message: on a terminal wrapped to its width, never between a number and its unit; elsewhere (a log)
    one line, whatever its length. Text from files in it (a label, a plug-in's error, a path) shows its control
    characters as escapes (:func:`topk_bench.untrusted.shown`)."""
    line = shown(line)
    if console.is_terminal:
        line = wrapped(line, console.width)
    console.print(line, highlight=False, markup=False, soft_wrap=True)


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
    # The title on a line of its own: a table's title wraps within the table's width.
    say(console, f"{suite}: {sum(written.values())} case(s) in {format_duration(elapsed_s)}")
    table = Table()
    table.add_column(col.STATUS)
    table.add_column("this run", justify="right")
    table.add_column("in file", justify="right")
    for status in sorted(set(written) | set(in_file)):
        table.add_row(status, str(written.get(status, 0)), str(in_file.get(status, 0)))
    console.print(table)
    say(console, f"results: {csv_path}")
    for note in notes:
        say(console, note)
