"""Resume: which cases of a plan run, given the rows already in its CSV.

A case without a row runs, and so does one whose row says only that its Slurm job
never ended on its own (``cancelled``, ``preempted``, ``lost``). A case whose row stopped its larger sizes
(``oom``, ``over_budget``, ``timeout``) runs again only when the budget that
failed has grown since (:func:`retry_reason`: the time budget for ``timeout``, the
memory budget for ``oom`` and ``over_budget``, both recorded in the row); with
the same budget it would fail the same way, so it stays and its larger sizes
stay ``skipped``. A ``skipped`` row runs again once no standing failure is
smaller than it. Every other row stays (``--no-resume`` measures them all again).

``--remeasure FLAGS`` (:func:`remeasured`) runs exactly the cases whose row carries one of
those ``trust`` flags, and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from topk_bench.case import Budget, Case
from topk_bench.results import columns as col
from topk_bench.results import trust
from topk_bench.run.order import Order
from topk_bench.status import INTERRUPTED, STOPPING, Status
from topk_bench.units import format_bytes

# The CPU's memory budget follows the memory available at the start of each run: a few percent up or
# down between runs is not a larger budget.
MEMORY_GROWTH = 1.05


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def retry_reason(row: Mapping[str, str], budget: Budget) -> str | None:
    """Why a stopping row runs again under ``budget`` (None: it does not): its own budget was smaller.

    A row without a recorded budget is not retried.
    """
    status = row.get(col.STATUS)
    if status == Status.TIMEOUT:
        old = _number(row.get(col.MAX_CASE_SECONDS))
        new = budget.max_seconds
        if old is not None and (new is None or new > old):
            return f"timeout at {old:g} s, now {'no limit' if new is None else f'{new:g} s'}"
    elif status in (Status.OOM, Status.OVER_BUDGET):
        old = _number(row.get(col.MAX_MEMORY_BYTES))
        new = budget.max_memory_bytes
        if old is not None and (new is None or new > old * MEMORY_GROWTH):
            return f"{status} at {format_bytes(old)}, now {'no limit' if new is None else format_bytes(new)}"
    return None


@dataclass
class Resume:
    todo: list[Case]  # cases to run, in plan order
    stoppers: list[tuple[Case, str]]  # rows that still stop their larger sizes, with their status
    retried: list[tuple[Case, str]] = field(default_factory=list)  # failed rows run again, and why
    kept: list[tuple[Case, str]] = field(default_factory=list)  # failed rows not run again (same budget)
    rerun_skipped: list[Case] = field(default_factory=list)  # skipped rows whose failure is retried
    remeasured: list[Case] = field(default_factory=list)  # --remeasure: flagged rows measured again
    interrupted: list[tuple[Case, str]] = field(default_factory=list)  # rows of a job cancelled, preempted, lost
    left: int = 0  # --remeasure: cases without a row, not run

    @property
    def replaced(self) -> set[str]:
        """case_ids whose old row goes once they have a new one."""
        return (
            {c.case_id for c, _ in self.retried}
            | {c.case_id for c in self.rerun_skipped}
            | {c.case_id for c, _ in self.interrupted}
            | {c.case_id for c in self.remeasured}
        )


def what_runs(cases: list[Case], rows: Sequence[Mapping[str, str]], budget: Budget, keys: list[str]) -> Resume:
    """What runs of ``cases`` given the file's ``rows``; ``keys``: the swept parameters (for "larger")."""
    existing = {r[col.CASE_ID]: r for r in rows}
    todo, stoppers, retried, kept, skipped, interrupted = [], [], [], [], [], []
    for case in cases:
        row = existing.get(case.case_id)
        if row is None:
            todo.append(case)
        elif row[col.STATUS] in INTERRUPTED:
            interrupted.append((case, row[col.STATUS]))
            todo.append(case)
        elif row[col.STATUS] in STOPPING:
            why = retry_reason(row, budget)
            if why:
                retried.append((case, why))
                todo.append(case)
            else:
                stoppers.append((case, row[col.STATUS]))
                kept.append((case, row[col.STATUS]))
        elif row[col.STATUS] == Status.SKIPPED:
            skipped.append(case)
    order = Order(cases, keys)
    rerun = [c for c in skipped if not any(order.larger(c, s) for s, _ in stoppers)]
    ids = {c.case_id for c in [*todo, *rerun]}
    todo = [c for c in cases if c.case_id in ids]
    return Resume(todo, stoppers, retried, kept, rerun, interrupted=interrupted)


def remeasured(cases: list[Case], rows: Sequence[Mapping[str, str]], flags: frozenset[str]) -> Resume:
    """``--remeasure FLAGS``: exactly the cases whose row carries one of ``flags`` (``trust``), in plan order."""
    existing = {r[col.CASE_ID]: r for r in rows}
    again = [c for c in cases if c.case_id in existing and trust.named(existing[c.case_id].get(col.TRUST)) & flags]
    return Resume(again, [], remeasured=again, left=sum(c.case_id not in existing for c in cases))


def notes(r: Resume) -> list[str]:
    """What the end of a run says about failed rows: which ran again, which did not, and how to force it."""
    out = []
    if r.retried:
        listed = "; ".join(why for _, why in r.retried[:3]) + ("; ..." if len(r.retried) > 3 else "")
        more = f" and {len(r.rerun_skipped)} skipped larger size(s)" if r.rerun_skipped else ""
        out.append(f"retried {len(r.retried)} failed case(s) whose budget grew{more} ({listed})")
    if r.kept:
        statuses = ", ".join(sorted({status for _, status in r.kept}))
        out.append(
            f"{len(r.kept)} case(s) that failed ({statuses}) under the same budget were not run again: "
            "raise --max-case-seconds or --max-memory to retry them"
        )
    if out:
        out.append("to measure every case again (not only the failed ones): --no-resume")
    if r.interrupted:
        statuses = ", ".join(sorted({status for _, status in r.interrupted}))
        out.insert(0, f"ran again {len(r.interrupted)} case(s) whose Slurm job was {statuses} before it ended")
    if r.left:
        out.append(
            f"{r.left} case(s) without a row were not run (--remeasure runs only flagged rows): "
            "run again without it to complete the suite"
        )
    return out
