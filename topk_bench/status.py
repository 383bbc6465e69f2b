"""The status of a case: the vocabulary of the CSV's ``status`` column, and what each status implies.

A ``str`` enum, so a status is written to and read from the CSV as its plain
value (``"ok"``, ``"oom"``...) and compares equal to it.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    OK = "ok"
    OOM = "oom"  # the device (or the machine) ran out of memory
    OVER_BUDGET = "over_budget"  # the peak exceeded the case's memory budget
    TIMEOUT = "timeout"  # killed after the case's time budget
    CRASHED = "crashed"  # the child process died (a signal; a Slurm job that failed)
    ERROR = "error"  # the case raised
    NONFINITE = "nonfinite"  # it ran, but its output (or a gradient, or an error metric) holds NaN or inf
    SKIPPED = "skipped"  # not run: a smaller size of the same implementation failed
    UNSUPPORTED = "unsupported"  # the implementation cannot run this case (activation, masking, prediction...)
    # It ran, but not as the case asked (another timer, dtype, thread count or code path; compile asked, ran eagerly):
    # the row keeps its numbers, and its columns say what ran.
    NOT_AS_ASKED = "not_as_asked"
    # What happened to the case's Slurm job, not to the case: it never ended on its own (resume runs it again).
    CANCELLED = "cancelled"  # the job was cancelled (scancel) by someone else than this run
    PREEMPTED = "preempted"  # the scheduler preempted the job
    LOST = "lost"  # the job was lost with its node (NODE_FAIL, BOOT_FAIL), or Slurm forgot it

    def __str__(self) -> str:
        return self.value


STATUSES: tuple[str, ...] = tuple(s.value for s in Status)
# After these, the larger sizes of the same implementation are skipped: they would fail too.
STOPPING: frozenset[Status] = frozenset({Status.OOM, Status.OVER_BUDGET, Status.TIMEOUT})
# Rows that say nothing about the case, only about where it ran: a resume runs them again.
INTERRUPTED: frozenset[Status] = frozenset({Status.CANCELLED, Status.PREEMPTED, Status.LOST})
