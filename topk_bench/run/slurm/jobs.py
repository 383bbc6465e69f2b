"""What Slurm says of submitted jobs: their states, the reasons pending ones wait, and what each means here.

States and reasons come from one ``squeue`` call for every watched job (``-r``: one line per
array task, pending ones too; it also lists recently finished jobs, for ``MinJobAge`` seconds), and
from ``sacct`` for jobs ``squeue`` has forgotten, so that clusters without accounting work too.

A pending job's reason says whether it will ever start. Most clear by themselves (``Resources``,
``Priority``, ``BeginTime``: a ``begin`` time in the future); some never do without someone changing
the cluster or the request (:data:`STUCK_REASONS`: the partition's limits or configuration refuse the
job, the nodes it needs are down or drained, its account or QOS is invalid, it is held): a run whose
job waits for one of those for :data:`STUCK_AFTER_S` ends, saying so (:meth:`JobStates.stuck`).
"""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence

from topk_bench.status import Status

# Slurm states in which a job may still produce its result.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
    }
)
# What the row of a job that ended in this state without a result says (anything else: crashed).
ENDED_AS: dict[str, Status] = {
    "TIMEOUT": Status.TIMEOUT,
    "DEADLINE": Status.TIMEOUT,
    "CANCELLED": Status.CANCELLED,
    "PREEMPTED": Status.PREEMPTED,
    "NODE_FAIL": Status.LOST,
    "BOOT_FAIL": Status.LOST,
    "VANISHED": Status.LOST,
}
# Pending reasons that do not clear by themselves (squeue's %r: a reason's name, or for a few its
# description; matched at the start). Held jobs wait for someone to release them.
STUCK_REASONS = (
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionDown",
    "PartitionInactive",
    "ReqNodeNotAvail",
    "NodeDown",
    "Nodes required for job are DOWN",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "DependencyNeverSatisfied",
    "JobHeldUser",
    "JobHeldAdmin",
)
# How long a job must wait for such a reason before the run gives up (a node rebooting passes).
STUCK_AFTER_S = 10.0
# A submitted job that squeue and sacct never list within this time is given up as lost.
NEVER_SEEN_S = 120.0


def stuck_reason(reason: str) -> bool:
    return reason.startswith(STUCK_REASONS)


class JobStates:
    """State (and pending reason) of submitted jobs, refreshed at most every ``poll_s`` seconds with one
    ``squeue`` call for all of them (thousands of ``done()`` calls must not become thousands of commands)."""

    def __init__(self, poll_s: float = 1.0, stuck_after_s: float = STUCK_AFTER_S):
        self.poll_s, self.stuck_after_s = poll_s, stuck_after_s
        self._states: dict[str, str] = {}
        self._reasons: dict[str, str] = {}  # pending jobs: why they wait
        self._stuck_since: dict[str, float] = {}
        self._watched: dict[str, float] = {}  # job id -> when submitted
        self._last = float("-inf")
        self._lock = threading.Lock()

    def watch(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            now = time.monotonic()
            self._watched.update((job_id, now) for job_id in job_ids)
            self._last = float("-inf")

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._watched.pop(job_id, None)
            self._reasons.pop(job_id, None)
            self._stuck_since.pop(job_id, None)

    def get(self, job_id: str, refresh: bool = False) -> str:
        """The job's state, ``UNKNOWN`` if Slurm knows nothing of it (yet or anymore)."""
        with self._lock:
            self._maybe_refresh(refresh)
            return self._states.get(job_id, "UNKNOWN")

    def counts(self) -> tuple[int, int, collections.Counter]:
        """(pending, running, how many wait for each reason) of the watched jobs."""
        with self._lock:
            self._maybe_refresh(False)
            states = [self._states.get(j, "UNKNOWN") for j in self._watched]
            reasons = collections.Counter(self._reasons[j] for j in self._watched if j in self._reasons)
        return states.count("PENDING"), states.count("RUNNING"), reasons

    def stuck(self) -> tuple[str, str] | None:
        """(job id, reason) of a watched job that has waited for a reason that does not clear for
        ``stuck_after_s``; None when there is none."""
        with self._lock:
            self._maybe_refresh(False)
            now = time.monotonic()
            for job_id, since in sorted(self._stuck_since.items(), key=lambda item: item[1]):
                if job_id in self._watched and now - since >= self.stuck_after_s:
                    return job_id, self._reasons.get(job_id, "")
        return None

    def _maybe_refresh(self, force: bool) -> None:
        if force or time.monotonic() - self._last >= self.poll_s:
            self._refresh()

    def _refresh(self) -> None:
        self._last = time.monotonic()
        pending = {j for j in self._watched if self._states.get(j, "UNKNOWN") in ACTIVE_STATES | {"UNKNOWN"}}
        if not pending:
            return
        found = squeue(sorted({j.split("_")[0] for j in pending}))
        if found is None:  # controller unreachable: keep what we knew, ask again later
            return
        missing = [j for j in pending if j not in found]
        if missing:
            found.update(sacct(sorted({j.split("_")[0] for j in missing})))
        for job_id in pending:
            # A whole array ended before its tasks were split (e.g. cancelled while pending) is one record "123".
            state, reason = found.get(job_id) or found.get(job_id.split("_")[0]) or ("", "")
            if state:
                self._states[job_id] = state
            elif self._states.get(job_id) in ACTIVE_STATES or self._last - self._watched[job_id] > NEVER_SEEN_S:
                # Purged before we saw it end (no accounting), or never listed at all.
                self._states[job_id] = "VANISHED"
            self._note_reason(job_id, reason if self._states.get(job_id) == "PENDING" else "")

    def _note_reason(self, job_id: str, reason: str) -> None:
        if reason and reason != "None":
            self._reasons[job_id] = reason
        else:
            self._reasons.pop(job_id, None)
        if reason and stuck_reason(reason):
            self._stuck_since.setdefault(job_id, self._last)
        else:
            self._stuck_since.pop(job_id, None)


def command(args: list[str]) -> subprocess.CompletedProcess | None:
    """A Slurm command's outcome; None when it could not run or did not answer within a minute."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def parse_states(text: str) -> dict[str, tuple[str, str]]:
    """``ID|STATE[|REASON]`` lines -> {id: (state, reason)}; job steps (``123.batch``) left out."""
    states = {}
    for line in text.splitlines():
        job_id, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job_id and state and "." not in job_id:
            # sacct prints "CANCELLED by 0"; squeue prints "CANCELLED".
            states[job_id] = (state.split()[0].rstrip("+"), reason.strip())
    return states


def squeue(array_ids: Sequence[str]) -> dict[str, tuple[str, str]] | None:
    """State and reason of the array tasks of ``array_ids`` (``-r``: one line per task, pending ones too)."""
    proc = command(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r", "-j", ",".join(array_ids)])
    if proc is None:
        return None
    if proc.returncode != 0:
        # All ids unknown to the controller (purged after MinJobAge) is an answer, not a failure.
        return {} if "Invalid job id" in proc.stderr else None
    return parse_states(proc.stdout)


def sacct(array_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    proc = command(["sacct", "-n", "-P", "-X", "-o", "JobID,State,Reason", "-j", ",".join(array_ids)])
    if proc is None or proc.returncode != 0:  # e.g. "Slurm accounting storage is disabled"
        return {}
    return parse_states(proc.stdout)


def names(array_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """{task id: (state, job name)} of the array tasks of ``array_ids`` that the controller still knows."""
    proc = command(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%j", "-j", ",".join(array_ids)])
    return parse_states(proc.stdout) if proc is not None and proc.returncode == 0 else {}
