"""Running a suite: the file lock, resume, scheduling with the skip-larger rule, one row per case as it ends.

:func:`run` plans (:mod:`.plan`: every input checked, and a suite of more
cases than ``max_cases`` refused unless told yes, before any file is touched),
refuses an existing CSV whose header does not fit its rows, takes the suite's
lock, writes ``<suite>.meta.json``, and appends one row per case to
``<suite>.csv`` as each ends. It is the only writer of the CSV.

With ``rounds`` > 1 every case is measured again in later rounds, each a pass over
the cases still ok (forwards, then backwards, so that no case always follows the
same one); a case's row, all its rounds' times pooled, is written after its last
round, and a round that is not ok writes its row at once. An interrupted run keeps
the rows written; the cases still in their rounds run again on resume.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import filelock

from topk_bench import fileio, machine
from topk_bench.case import Case, Measurement
from topk_bench.errors import BadInput, file_error
from topk_bench.measure import metadata
from topk_bench.report.plots import timeline
from topk_bench.results import columns as col
from topk_bench.results import store, trust
from topk_bench.results.row import make_row
from topk_bench.run.executors import Executor, check_requests, get_executor
from topk_bench.run.order import Order, describe_size
from topk_bench.run.plan import Plan, earlier_meta, meta, plan, size_note
from topk_bench.run.progress import Eta, Reporter, summary
from topk_bench.run.resolve import Flags
from topk_bench.run.resume import Resume, remeasured, what_runs
from topk_bench.run.resume import notes as resume_notes
from topk_bench.status import STOPPING, Status
from topk_bench.units import format_duration
from topk_bench.workloads import traffic
from topk_bench.workloads.support import unsupported

POLL_S = 0.05
PROGRESS_EVERY_S = 2.0


@dataclass
class RunResult:
    plan: Plan
    written: collections.Counter  # statuses of the rows this run appended
    in_file: collections.Counter  # statuses of every row of this suite's cases in the CSV
    elapsed_s: float
    notes: list[str] = field(default_factory=list)  # what resume retried or kept, said with the summary

    @property
    def csv_path(self) -> Path:
        return self.plan.csv_path


def _defaults(device: str) -> dict[str, str]:
    """torch version, git sha, device name for rows without a measurement (skipped, unsupported)."""
    try:
        return {
            col.TORCH_VERSION: metadata.torch_version(),
            col.GIT_SHA: metadata.git_sha(),
            col.DEVICE_NAME: metadata.device_name(device),
        }
    except Exception:  # noqa: BLE001 -- provenance is best effort; a row must still be written
        return {}


class _Writer:
    """Appends rows to the suite's CSV and reports them."""

    def __init__(self, plan: Plan, reporter: Reporter):
        self.plan, self.reporter = plan, reporter
        self.header = plan.header
        self.written: collections.Counter = collections.Counter()
        self.keys = list(plan.suite.sweep)
        self.defaults = _defaults(plan.device)

    def what(self, case: Case) -> str:
        return f"{col.legend(case.label, case.impl)} {describe_size(case, self.keys)}"

    def write(self, case: Case, measurement: Measurement) -> None:
        if case.profile:  # the child wrote the profile's data; its figure is drawn here, by the parent
            problem = timeline.draw(Path(case.profile))
            if problem:
                self.reporter.note(f"warning: {problem}")
        row = make_row(case, measurement, self.defaults, traffic(case), self.plan.budget)
        row[col.SUITE_FINGERPRINT] = self.plan.suite.fingerprint
        self.header = store.append_row(self.plan.csv_path, row, self.header)
        self.written[str(measurement.status)] += 1
        self.reporter.finished(self.what(case), row)


class _Rounds:
    """Stands in for the writer while a case has rounds to go: holds its ok measurements, then writes them pooled."""

    def __init__(self, writer: _Writer, rounds: int):
        self.writer, self.rounds, self.round = writer, rounds, 1
        self.keys, self.reporter, self.what = writer.keys, writer.reporter, writer.what
        self.held: dict[str, list[Measurement]] = {}  # case_id: its ok rounds so far

    def write(self, case: Case, measurement: Measurement) -> None:
        if measurement.status != Status.OK:  # this round failed: the case's row says so, and it runs no more
            self.held.pop(case.case_id, None)
            if self.round > 1:
                measurement = replace(measurement, error=f"round {self.round} of {self.rounds}: {measurement.error}")
            self.writer.write(case, measurement)
        else:
            self.held.setdefault(case.case_id, []).append(measurement)

    def pending(self, cases: list[Case]) -> list[Case]:
        """Of ``cases``, those ok in every round so far, in that order."""
        return [c for c in cases if c.case_id in self.held]

    def flush(self, cases: list[Case]) -> None:
        for case in self.pending(cases):
            self.writer.write(case, pooled(self.held.pop(case.case_id)))


def pooled(rounds: list[Measurement]) -> Measurement:
    """One measurement of a case's rounds: every round's times, the largest peaks, the load from first to last,
    the contention of the worst round."""
    first, last = rounds[0], rounds[-1]

    def most(name: str) -> int | None:
        values = [getattr(m, name) for m in rounds if getattr(m, name) is not None]
        return max(values) if values else None

    metadata = {**first.metadata, col.LOAD_END: last.metadata.get(col.LOAD_END), col.ROUNDS: len(rounds)}
    for key, worst in trust.WORST_OF_ROUNDS.items():  # the machine as the worst round saw it
        values = [v for m in rounds if (v := m.metadata.get(key)) is not None]
        if values:
            metadata[key] = worst(values)
    return replace(
        first,
        times_s=[t for m in rounds for t in m.times_s],
        fwd_times_s=[t for m in rounds for t in m.fwd_times_s],
        bwd_times_s=[t for m in rounds for t in m.bwd_times_s],
        peak_bytes=most(col.PEAK_BYTES),
        reserved_bytes=most(col.RESERVED_BYTES),
        metadata=metadata,
    )


class _Watch:
    """While cases wait on an executor that can say how they do (Slurm): its line when it changes (at most
    every :data:`PROGRESS_EVERY_S`), and the end of the run when it says they cannot go on."""

    def __init__(self, executor: Executor, reporter: Reporter):
        self.progress = getattr(executor, "progress", None)
        self.stuck = getattr(executor, "stuck", None)
        self.reporter = reporter
        self.shown, self.at = "", float("-inf")

    def check(self) -> None:
        if self.stuck is not None:
            problem = self.stuck()
            if problem:
                raise BadInput(problem, key="executor")
        if self.progress is not None and time.monotonic() - self.at >= PROGRESS_EVERY_S:
            line = self.progress()
            if line != self.shown:
                self.reporter.waiting(line)
                self.shown, self.at = line, time.monotonic()


def _run_rounds(
    plan: Plan, todo: list[Case], stoppers: list[tuple[Case, str]], executor: Executor, writer: _Writer
) -> None:
    """Round 1 as a run of one round (the skip-larger rule included), then the later rounds over what stayed ok."""
    if plan.rounds == 1:
        _schedule(plan, todo, stoppers, executor, writer)
        return
    rounds = _Rounds(writer, plan.rounds)
    started = time.monotonic()
    _schedule(plan, todo, stoppers, executor, rounds)
    for number in range(2, plan.rounds + 1):
        _round_done(writer.reporter, number - 1, plan.rounds, len(rounds.pending(todo)), started)
        rounds.round = number
        cases = rounds.pending(todo)
        if not cases:
            break
        writer.reporter.note(f"round {number} of {plan.rounds}: {len(cases)} case(s)")
        _schedule(plan, cases[::-1] if number % 2 == 0 else cases, [], executor, rounds, skip_rule=False)
    else:
        _round_done(writer.reporter, plan.rounds, plan.rounds, len(rounds.pending(todo)), started)
    rounds.flush(todo)


def _round_done(reporter: Reporter, number: int, rounds: int, ok: int, started: float) -> None:
    """The line a round ends with: how many cases are still ok, how long the rounds took and may still take (the
    rows of the cases ok in every round are written after the last)."""
    elapsed = time.monotonic() - started
    left = "" if number == rounds else f", about {format_duration(elapsed / number * (rounds - number))} left"
    reporter.note(
        f"round {number} of {rounds} done in {format_duration(elapsed)}{left}: {ok} case(s) ok in every round so "
        "far" + ("" if number == rounds else f" (their rows are written after round {rounds})")
    )


def _schedule(
    plan: Plan,
    todo: list[Case],
    stoppers: list[tuple[Case, str]],
    executor: Executor,
    writer: _Writer | _Rounds,
    skip_rule: bool = True,
) -> None:
    """Submit cases when no smaller size of their implementation is pending; skip those above a stopper.

    ``skip_rule=False`` (later rounds, whose cases were all ok once): submit in the given order, skip nothing.
    """
    order = Order(plan.cases, writer.keys)
    batch = bool(getattr(executor, "prefers_batches", False))  # e.g. Slurm: one array, cancel what is not needed
    waiting = list(todo)
    running: list[tuple[Case, Any]] = []
    watch = _Watch(executor, writer.reporter)

    def skip_larger(than: Case, status: str) -> None:
        nonlocal waiting
        reason = f"skipped: {than.impl} hit {status} at {describe_size(than, writer.keys)}"
        for case in [c for c in waiting if order.larger(c, than)]:
            waiting.remove(case)
            writer.write(case, Measurement(status=Status.SKIPPED, error=reason))
        for case, handle in [(c, h) for c, h in running if order.larger(c, than)]:
            if handle.cancel():
                running.remove((case, handle))
                writer.write(case, Measurement(status=Status.SKIPPED, error=reason))

    for stopper, status in stoppers:
        skip_larger(stopper, f"{status} in an earlier run")
    changed = True
    while waiting or running:
        if changed:  # what became ready only changes when a case ends or is skipped
            pending = [c for c, _ in running] + waiting
            ready = (
                waiting
                if batch or not skip_rule
                else [c for c in waiting if not any(order.larger(c, p) for p in pending)]
            )
            if ready:
                waiting = [c for c in waiting if c not in ready]
                running += list(zip(ready, executor.submit(ready, plan.budget)))
            if running:
                writer.reporter.running(writer.what(running[0][0]))
        finished = [(c, h) for c, h in running if h.done()]
        changed = bool(finished)
        for case, handle in finished:
            if (case, handle) not in running:  # cancelled by an earlier skip in this loop
                continue
            running.remove((case, handle))
            measurement = handle.result()
            writer.write(case, measurement)
            if measurement.status in STOPPING and skip_rule:
                skip_larger(case, measurement.status)
        if not finished:
            watch.check()
            time.sleep(POLL_S)


def _existing(the_plan: Plan, append: bool) -> store.Table:
    """The file's valid rows, once it is clear that rows appended under its header will line up with them, and
    that they are this suite's: rows of another suite of the same name (another fingerprint, none of this one's)
    are bad input, unless ``append``."""
    csv_path = the_plan.csv_path
    table = store.read(csv_path)
    problem = table.header_problem() if table.header else None
    if problem:
        raise BadInput(problem, file=csv_path)
    theirs = {row.get(col.SUITE_FINGERPRINT) or "" for row in table.rows} - {""}
    ours = the_plan.suite.fingerprint
    if theirs and ours not in theirs and not append and not theirs <= _same_file_runs(the_plan):
        written_by = _suite_file(the_plan.meta_path)
        if written_by is not None and str(the_plan.suite.path) == written_by:
            problem = (
                f"holds the rows of an earlier version of {written_by} (fingerprint {', '.join(sorted(theirs))}; "
                f"it is {the_plan.file_fingerprint} now): use another --out for the edited suite; --append adds "
                "its rows to that file"
            )
        else:
            problem = (
                f"holds the rows of another suite named {the_plan.suite.name!r} (fingerprint "
                f"{', '.join(sorted(theirs))}" + (f", from {written_by}" if written_by else "") + f") than "
                f"{the_plan.suite.path} (fingerprint {ours}): rename one of them, or use another --out; --append "
                "adds this suite's rows to that file"
            )
        raise BadInput(problem, file=csv_path)
    return table


def _same_file_runs(the_plan: Plan) -> set[str]:
    """The fingerprints of the earlier runs of this suite file, as it is now, with any ``--set`` values, whose
    rows the folder holds (meta.json's ``set_runs``): a ``--set`` run adds its rows beside theirs."""
    earlier = earlier_meta(the_plan)
    if earlier.get("file_fingerprint") != the_plan.file_fingerprint:
        return {the_plan.file_fingerprint}
    runs = earlier.get("set_runs")
    found = {str(r.get("fingerprint")) for r in runs if isinstance(r, dict)} if isinstance(runs, list) else set()
    return {the_plan.file_fingerprint, *found}  # the file's own rows, without --set, too


def _suite_file(meta_path: Path) -> str | None:
    """The suite file an earlier run's meta.json names (None: none, or not said)."""
    try:
        meta_json = fileio.read_json(meta_path)
    except (OSError, BadInput):
        return None
    named = meta_json.get("suite_file") if isinstance(meta_json, dict) else None
    return named if isinstance(named, str) else None


def busy_note(the_plan: Plan) -> str | None:
    """One warning before a measured run when the machine is already busy (the rows will say so too)."""
    load = machine.load_per_core()
    if the_plan.cases and not the_plan.settings.predicted and load is not None and load > trust.BUSY_LOAD_PER_CORE:
        return (
            f"warning: the machine is busy (1-minute load {load:.2f} per core, above "
            f"{trust.BUSY_LOAD_PER_CORE:g}): times measured now are flagged 'busy' in the trust column"
        )
    return None


def _profile_note(the_plan: Plan, todo: list[Case]) -> str | None:
    """``run --profile``: one warning before the cases run when their profiles cannot be written (a file where the
    profiles' directory belongs, a read-only place): each case is measured all the same, and its row says so."""
    if not the_plan.settings.profile or not todo:
        return None
    place = Path(todo[0].profile).parent
    problem = fileio.directory_problem(place)
    if problem is None:
        return None
    return (
        f"warning: {place}: profiles cannot be written there ({problem.strerror or problem}): each case is "
        "measured all the same, its row's error says its profile is missing"
    )


def _left_out_note(table: store.Table) -> str:
    more = f" (and {len(table.dropped) - 1} more)" if len(table.dropped) > 1 else ""
    return f"left out {table.dropped[0]}{more}; a case without a valid row runs again"


@contextlib.contextmanager
def _locked(csv_path: Path) -> Iterator[None]:
    """Hold the suite's lock (``OUT/.<suite>.csv.lock``): one run writes a file at a time."""
    try:
        csv_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise file_error(exc, "cannot create the results directory", key="--out") from None
    lock = filelock.FileLock(csv_path.with_name(f".{csv_path.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise BadInput("another topk-bench run is writing this file; wait for it or use --out", file=csv_path) from None
    except OSError as exc:
        raise file_error(exc, "cannot create the lock file") from None
    try:
        yield
    finally:
        lock.release()


def journal_path(csv_path: Path) -> Path:
    """Where a Slurm run writes down its jobs for the next run (``OUT/.<suite>.slurm-jobs.jsonl``)."""
    return csv_path.with_name(f".{csv_path.stem}.slurm-jobs.jsonl")


def history_path(csv_path: Path) -> Path:
    """Where ``--remeasure`` keeps the rows it measures again: ``OUT/history/<suite>.csv`` (a results CSV
    of its own, which a reader of ``OUT`` does not mix with the current rows)."""
    return csv_path.parent / "history" / csv_path.name


def _what_runs(the_plan: Plan, table: store.Table, resume: bool) -> Resume:
    """Which cases run (resume, ``--no-resume`` or ``--remeasure``). The rows they replace stay until each
    case has a new one (:func:`run` drops them then); ``--remeasure`` first copies them into the history."""
    csv_path, cases = the_plan.csv_path, the_plan.cases
    if the_plan.settings.remeasure:
        chosen = remeasured(cases, table.rows, the_plan.settings.remeasure)
        store.copy_rows(csv_path, history_path(csv_path), {c.case_id for c in chosen.remeasured})
        return chosen
    # --no-resume: every case of this run is measured again (rows of other devices and methods stay).
    ids = {c.case_id for c in cases}
    rows = table.rows if resume else [r for r in table.rows if r[col.CASE_ID] not in ids]
    return what_runs(cases, rows, the_plan.budget, list(the_plan.suite.sweep))


def run(
    suite_path: str | Path,
    flags: Flags | None = None,
    *,
    config: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    executor_obj: Executor | None = None,
    yes: bool = False,
    append: bool = False,
) -> RunResult:
    """Run (or resume) a suite with the settings ``flags`` gives over the suite's and ``config``'s (bench.toml).

    A suite of more cases than ``max_cases`` is bad input unless ``yes``; a results file holding the rows of
    another suite of the same name (another fingerprint) is bad input unless ``append``.
    Ctrl-C propagates as ``KeyboardInterrupt`` once the executor is closed; every finished row is on disk.
    """
    started = time.monotonic()
    the_plan = plan(suite_path, flags, config=config, yes=yes)
    if the_plan.settings.remeasure and not resume:
        raise BadInput("re-runs the flagged rows, --no-resume every row: choose one", key="--remeasure")
    csv_path = the_plan.csv_path
    _existing(the_plan, append)  # a damaged file, or another suite's, is refused before any file is touched
    if executor_obj is None:
        check_requests(the_plan.executor, the_plan.cases)  # Slurm: a request no node can satisfy, before any job
    ids = {c.case_id for c in the_plan.cases}
    with _locked(csv_path):
        _existing(the_plan, append)  # under the lock, before this run's meta.json replaces the other suite's
        try:
            fileio.write_atomic(the_plan.meta_path, (json.dumps(meta(the_plan), indent=2) + "\n").encode())
            if csv_path.exists():  # an earlier run measuring cases again was killed before it tidied up
                store.drop_superseded(csv_path, ids)
        except OSError as exc:
            raise file_error(exc, "cannot write") from None
        table = _existing(the_plan, append)  # again, under the lock
        plan_resume = _what_runs(the_plan, table, resume)
        try:
            written = _measure(the_plan, plan_resume, table, executor_obj, progress, adopt=resume)
        finally:  # the old rows of cases measured again go once they have new ones: an interrupted run loses none
            with contextlib.suppress(OSError, BadInput):  # (if this fails, readers take the newest row anyway)
                store.drop_superseded(csv_path, plan_resume.replaced if resume else ids)
        in_file = collections.Counter(r[col.STATUS] for r in store.read_rows(csv_path) if r[col.CASE_ID] in ids)
        return RunResult(the_plan, written, in_file, time.monotonic() - started, resume_notes(plan_resume))


def _remeasure_note(the_plan: Plan, chosen: Resume) -> list[str]:
    flags = the_plan.settings.remeasure
    if not flags:
        return []
    return [
        f"--remeasure {','.join(sorted(flags))}: {len(chosen.remeasured)} flagged case(s) measured again, "
        f"their old rows (and samples) copied to {history_path(the_plan.csv_path)}, each dropped here once "
        "its case has a new row; every other row kept"
    ]


def _measure(
    the_plan: Plan,
    plan_resume: Resume,
    table: store.Table,
    executor_obj: Executor | None,
    progress: bool,
    *,
    adopt: bool,
) -> collections.Counter:
    """Run the cases resume left to do, one row each as it ends; the statuses of the rows written. ``adopt``:
    Slurm jobs an earlier run of these cases left running are taken over (resume of a one-round run)."""
    todo, stoppers = plan_resume.todo, plan_resume.stoppers
    size, guess = size_note(the_plan, todo, table.rows)
    eta = Eta(guess.per_case if guess else None, slots=guess.at_once if guess else 1, rounds=the_plan.rounds)
    reporter = Reporter(
        the_plan.suite.name, len(the_plan.cases), len(the_plan.cases) - len(todo), enabled=progress, eta=eta
    )
    with reporter:
        for note in [
            size,
            *the_plan.notes,
            *_remeasure_note(the_plan, plan_resume),
            *([_left_out_note(table)] if table.dropped else []),
            *filter(None, [busy_note(the_plan), _profile_note(the_plan, todo)]),
        ]:
            reporter.note(note)
        writer = _Writer(the_plan, reporter)
        if the_plan.settings.predicted:
            for case in list(todo):
                problem = unsupported(case, predict=True)
                if problem:
                    todo.remove(case)
                    writer.write(case, Measurement(status=Status.UNSUPPORTED, error=problem))
        if todo:
            executor = executor_obj or get_executor(
                the_plan.executor,
                gpus=the_plan.gpus,
                journal=journal_path(the_plan.csv_path),
                adopt=adopt and the_plan.rounds == 1,
            )
            try:
                _run_rounds(the_plan, todo, stoppers, executor, writer)
            finally:
                executor.close()
    return writer.written


def next_step(result: RunResult) -> str:
    """The one line after a run: what to look at next."""
    out = result.csv_path.parent
    steps = [f"topk-bench show {out}", f"topk-bench plot {out}"]
    if result.plan.cases and not result.plan.settings.predicted:
        steps.append(f"topk-bench run {result.plan.suite.path} --predict (peak memory at full scale, no compute)")
    return "next: " + "  |  ".join(steps)


def print_summary(result: RunResult) -> None:
    summary(
        result.plan.suite.name,
        result.csv_path,
        result.written,
        result.in_file,
        result.elapsed_s,
        notes=[*result.notes, next_step(result)],
    )
