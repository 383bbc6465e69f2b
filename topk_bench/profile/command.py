"""``topk-bench profile``: the parent's side. The suite planned as ``run`` plans it, the cases picked by
``--case``, each run in its own child (as ``run`` runs it) with a profile directory, then told.

A profile lives in ``DIR/<case_id>/`` (:mod:`topk_bench.capture.files`), written by the child; the parent
draws its ``timeline.png`` (:mod:`topk_bench.report.plots.timeline`). Before a case runs, the files of an earlier
profile there are removed, so that none is left from another method or device.

Before any case runs: more cases than ``max_cases`` is bad input unless told yes, and so is a ``DIR`` that
cannot hold the profiles; then how many cases and how long they may take is said, and each case is told as it
ends.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from topk_bench import fileio
from topk_bench.capture import files, summary
from topk_bench.case import Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.profile import select
from topk_bench.report.plots import timeline
from topk_bench.status import Status
from topk_bench.units import format_seconds

_FILES = (files.META, files.PEAK, files.TIMELINE, "timeline.png", files.SNAPSHOT, "ops.csv", "trace.json")


@dataclass
class Outcome:
    case: Case
    measurement: Measurement

    @property
    def directory(self) -> Path:
        return Path(self.case.profile)

    @property
    def ok(self) -> bool:
        """A profile was written (a case over its memory budget is profiled all the same: it ran)."""
        return (self.directory / files.META).is_file()


def with_profile(cases: list[Case], directory: Path) -> list[Case]:
    """The cases, each with its profile directory ``directory/<case_id>``."""
    return [dataclasses.replace(c, profile=str(directory / c.case_id)) for c in cases]


def clear(directory: Path) -> None:
    """Remove an earlier profile's files from ``directory`` (nothing else)."""
    for name in _FILES:
        path = directory / name
        if path.is_file():
            path.unlink()


def _check_place(directory: Path, cases: list[Case]) -> None:
    """``directory`` holds the profiles (made now) and each case's ``directory/<case_id>`` can be one: else bad
    input, before any case runs."""
    problem = fileio.directory_problem(directory)
    if problem is not None:
        raise BadInput(f"cannot hold the profiles: {problem.strerror or problem}", file=directory, key="--out")
    for case in cases:
        place = directory / case.case_id
        if place.exists() and not place.is_dir():
            raise BadInput("expected a directory for this case's profile, got a file", file=place, key="--out")


def _say(line: str) -> None:
    print(f"topk-bench: {line}", file=sys.stderr)


def profile(
    suite: Path,
    selector: str | Sequence[str],
    *,
    predict: bool,
    device: str | None,
    out: Path | None,
    config: Path | None,
    sets: tuple[str, ...] = (),
    yes: bool = False,
    say: Callable[[str], None] = _say,
    told: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Plan ``suite``, pick the cases ``selector`` names (one ``--case`` or several), and profile each in a
    child, one at a time. Raises BadInput before any case runs: more cases than ``max_cases`` unless ``yes``, a
    ``DIR`` that cannot hold the profiles. ``say`` hears how many cases and how long first; ``told`` each case
    as it ends."""
    from topk_bench import machine
    from topk_bench.run import estimate, launcher
    from topk_bench.run.plan import PROFILE_DIR, plan
    from topk_bench.run.resolve import Flags

    # Every case of the suite may be picked: only the picked ones count against max_cases, below.
    the_plan = plan(suite, Flags(predict=predict, device=device, out=out, sets=sets), config=config, yes=True)
    wanted = select.parse(selector, select.known_values(the_plan.cases))
    directory = Path(out if out is not None else the_plan.settings.out_dir / PROFILE_DIR)
    chosen = select.select(the_plan.cases, wanted, suite=str(suite))
    one_at_a_time = the_plan.executor.model_copy(update={"kind": "local", "jobs": 1})
    if len(chosen) > the_plan.settings.max_cases and not yes:
        how_long = estimate.at_most(len(chosen), the_plan.budget.max_seconds, one_at_a_time)
        raise BadInput(
            f"{len(chosen)} cases to profile, {how_long}: more than max_cases = {the_plan.settings.max_cases}; "
            "pass --yes to profile them, or pick fewer with --case",
            file=suite,
            key="max_cases",
        )
    _check_place(directory, chosen)
    slower = estimate.slowdown(one_at_a_time, the_plan.settings.threads, machine.busy_now(), machine.cores())
    how_long = estimate.estimate(chosen, one_at_a_time, the_plan.budget.max_seconds, slower=slower).text()
    say(f"{len(chosen)} case{'' if len(chosen) == 1 else 's'} to profile into {directory}/, one at a time, {how_long}")
    outcomes = []
    for case in with_profile(chosen, directory):
        clear(Path(case.profile))
        outcome = Outcome(case, launcher.run_isolated(case, the_plan.budget))
        problem = timeline.draw(Path(case.profile))
        if problem:
            say(f"warning: {problem}")
        outcomes.append(outcome)
        if told is not None:
            told(outcome)
    return outcomes


def _ops_table(directory: Path, limit: int = 8):
    import csv

    from rich import box
    from rich.table import Table

    path = directory / "ops.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as handle:
        ops = [r for r in csv.DictReader(handle) if r["op"].startswith("aten::")]
    device = any(r["self_device_s"] for r in ops)
    table = Table(
        title="time by op (one more iteration, under torch.profiler)", box=box.SIMPLE_HEAD, title_justify="left"
    )
    for name in ("op", "calls", "self host", "total host", *(("self device", "total device") if device else ())):
        table.add_column(name, justify="left" if name == "op" else "right")
    for r in ops[:limit]:
        cells = [r["op"], r["calls"], format_seconds(r["self_host_s"]), format_seconds(r["total_host_s"])]
        if device:
            cells += [format_seconds(r["self_device_s"]), format_seconds(r["total_device_s"])]
        table.add_row(*cells)
    return table


def tell(outcome: Outcome, console: Console) -> None:
    """The summary of one profiled case: the story, the grouped table, time where measured, the files."""
    m = outcome.measurement
    if not outcome.ok:
        console.print(
            f"{files.what(outcome.case)}: {m.status}: {m.error or 'no profile written'}", markup=False, highlight=False
        )
        return
    info, rows = files.read(outcome.directory)
    console.print(summary.headline(info), markup=False, highlight=False)
    if m.status != Status.OK:
        console.print(f"status {m.status}: {m.error}", markup=False, highlight=False)
    console.print(summary.table(rows, info, width=console.width))
    console.print(info["story"], markup=False, highlight=False)
    if info.get("stages"):
        console.print(summary.stages_line(info["stages"]), markup=False, highlight=False)
    counts = [f"{info['ops_per_iteration']} aten ops per iteration"] if info.get("ops_per_iteration") else []
    if info.get("kernel_launches") is not None:
        counts.append(f"{info['kernel_launches']} kernel launches")
    share = info.get("user_share")
    if share is not None:
        counts.append(f"{100 * share:.2f}% of the bytes above the inputs named by a line of the user's code")
    if counts:
        console.print("; ".join(counts), markup=False, highlight=False)
    ops = _ops_table(outcome.directory)
    if ops is not None:
        console.print(ops)
    for note in info.get("notes", []):
        console.print(f"note: {note}", markup=False, highlight=False)
    written = ", ".join(name for name in _FILES if (outcome.directory / name).is_file())
    console.print(f"profile: {outcome.directory}/ ({written})", markup=False, highlight=False)
    console.print()
