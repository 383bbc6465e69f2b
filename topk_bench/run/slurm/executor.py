"""Run cases as jobs on a Slurm cluster through submitit (``--executor slurm``).

Each ``submit`` call becomes one job array per kind of request (one array task per case): a case asks
what it needs (:mod:`.slurm_requests`: one CPU for a prediction, its threads for a measurement, its
GPU on CUDA), checked against the partition before the run submits anything. A task runs
``run_in_job``, which measures its case through the same entry point as the local executor
(``topk_bench.run.launcher.run_isolated``: a child process per case, forked from a warm template on
the node), so a crash or a per-case timeout inside the job is a normal ``Measurement`` returned
through submitit's result pickle, exactly as locally.

When the job itself ends without a result, the handle turns its final Slurm state into a row
(:data:`.slurm_jobs.ENDED_AS`): ``cancelled`` (scancel), ``preempted``, ``lost`` (its node failed, or
Slurm forgot it), ``timeout`` (Slurm's time limit), else ``crashed``, its ``error`` holding the tail
of the job's log; a resume runs the first three again. Jobs are never requeued by Slurm
(``--no-requeue``), so no case runs twice behind the run's back. While jobs wait, the executor says
how many pend and run and why (:meth:`SlurmExecutor.progress`), and a reason that will not clear
(:meth:`SlurmExecutor.stuck`) ends the run. Submitted jobs are written down (:mod:`.slurm_journal`)
so that a run killed without cleaning up leaves them to the next run, which adopts or cancels them.

The parent only submits, polls and collects: it stays the only writer of the CSV.
"""

from __future__ import annotations

import collections
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.run.launcher import CaseRunner, run_isolated
from topk_bench.run.slurm import jobs as slurm_jobs
from topk_bench.run.slurm.jobs import ACTIVE_STATES, ENDED_AS, JobStates, command
from topk_bench.run.slurm.journal import Entry, Journal
from topk_bench.run.slurm.requests import request, sbatch_parameters
from topk_bench.status import INTERRUPTED, Status

try:  # optional dependency; get_executor turns this ImportError into one line of bad input
    import submitit
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"submitit is not installed ({exc}); pip install 'topk-bench[slurm]'") from exc


# Default MaxArraySize is 1001: larger suites are split into several arrays.
MAX_ARRAY = 1000
LOG_TAIL_CHARS = 2000
# How long a job whose case crashed may take to leave its active states (a cancelled one stays COMPLETING
# through Slurm's KillWait, 30 s by default) before its fate decides the row.
FATE_SETTLE_S = 60.0
# What a row of a job that ended without a result says of it, by the status it becomes.
ENDED_HOW = {
    Status.CANCELLED: "was cancelled (scancel) before it ended",
    Status.PREEMPTED: "was preempted",
    Status.LOST: "was lost (with its node, or Slurm forgot it)",
    Status.TIMEOUT: "reached Slurm's time limit (timeout_min)",
}


def run_in_job(case_json: str, budget_json: str, run: CaseRunner | None = None) -> str:
    """What each array task runs on the compute node: ``run`` (default: the
    local executor's ``run_isolated``) on the case. Case and result travel as
    JSON, the format the rest of the harness already round-trips."""
    run = run or run_isolated
    case = Case.from_json(case_json)
    budget = Budget.from_json(budget_json)
    measurement = run(case, budget)
    measurement.metadata.setdefault("slurm_job_id", _job_id_from_env())
    measurement.metadata.setdefault("slurm_node", os.environ.get("SLURMD_NODENAME", ""))
    return measurement.to_json()


def _job_id_from_env() -> str:
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return os.environ.get("SLURM_JOB_ID", "")


def log_tail(job, limit: int = LOG_TAIL_CHARS) -> str:
    """The end of the job's stderr (where tracebacks, srun and Slurm's own kill
    messages go), or of its stdout when stderr is empty."""
    for path in (job.paths.stderr, job.paths.stdout):
        try:
            text = Path(path).read_text(errors="replace").strip()
        except OSError:
            continue
        if text:
            return text[-limit:]
    return f"(no log in {job.paths.folder})"


class SlurmHandle:
    """One case = one array task (submitted by this run, or adopted from an earlier one)."""

    def __init__(self, job, states: JobStates, settle_s: float = 10.0):
        self.job = job
        self._states = states
        self._settle_s = settle_s  # how long a finished job's result pickle may lag on a shared filesystem
        self._ended_at: float | None = None
        self._cancelled = False
        self._result: Measurement | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def _has_result(self) -> bool:
        return Path(self.job.paths.result_pickle).exists()

    def done(self) -> bool:
        if self._result is not None or self._cancelled or self._has_result():
            return True
        state = self._states.get(self.job_id)
        if state in ACTIVE_STATES or state == "UNKNOWN":
            self._ended_at = None
            return False
        if state == "COMPLETED":  # the result pickle is on its way through the shared filesystem (or never comes)
            self._ended_at = self._ended_at or time.monotonic()
            return time.monotonic() - self._ended_at > self._settle_s
        return True

    def result(self) -> Measurement:
        while not self.done():
            time.sleep(min(self._states.poll_s, 1.0))
        if self._result is None:
            self._result = self._collect()
            self._states.forget(self.job_id)
        return self._result

    def _collect(self) -> Measurement:
        meta = {"slurm_job_id": self.job_id}
        if self._cancelled:
            return Measurement(status=Status.SKIPPED, error="cancelled before it ran", metadata=meta)
        if self._has_result():
            try:
                return self._fate_over(Measurement.from_json(self.job.result()), meta)
            except Exception as exc:  # noqa: BLE001 -- the job function raised (topk_bench not importable there...)
                # submitit's own handler of Slurm's pre-time-limit signal ends the job this way.
                status = Status.TIMEOUT if "timed-out" in str(exc) else Status.CRASHED
                return Measurement(
                    status=status, error=f"{type(exc).__name__}: {str(exc)[-LOG_TAIL_CHARS:]}", metadata=meta
                )
        state = self._states.get(self.job_id, refresh=True)
        status = ENDED_AS.get(state, Status.CRASHED)
        how = ENDED_HOW.get(status, "ended")
        again = "; a resume runs it again" if status in INTERRUPTED else ""
        return Measurement(
            status=status,
            error=f"slurm job {self.job_id} {how} ({state}) without a result{again}; log tail:\n{log_tail(self.job)}",
            metadata=meta,
        )

    def _fate_over(self, measured: Measurement, meta: dict) -> Measurement:
        """A job cancelled, preempted or lost while its case ran still returns a result: submitit lets the job
        process outlive Slurm's SIGTERM, which kills the case's processes, so the case reads ``crashed``. The
        job's fate is the truth then (resumable), the case's own words kept."""
        if measured.status != Status.CRASHED:
            return measured
        state, settled_by = self._states.get(self.job_id, refresh=True), time.monotonic() + FATE_SETTLE_S
        while (state in ACTIVE_STATES or state == "UNKNOWN") and time.monotonic() < settled_by:
            time.sleep(min(self._states.poll_s, 1.0) or 0.2)  # a cancelled job is COMPLETING until KillWait ends
            state = self._states.get(self.job_id, refresh=True)
        fate = ENDED_AS.get(state)
        if fate not in INTERRUPTED:
            return measured
        return Measurement(
            status=fate,
            error=f"slurm job {self.job_id} {ENDED_HOW[fate]} ({state}); a resume runs "
            f"it again; the case saw: {measured.error}",
            metadata=meta,
        )

    def cancel(self) -> bool:
        """Cancel if still pending. (Not ``scancel --state=PENDING``: on an array whose
        tasks are all pending, Slurm 22.05 applies it to the whole array.)"""
        if self._cancelled:
            return True
        if self.done() or self._states.get(self.job_id, refresh=True) != "PENDING":
            return False
        command(["scancel", self.job_id])
        # A pending array task cancelled before Slurm split it off leaves no record (VANISHED).
        # If it started in between, it ran for a moment at most: still never measured.
        if self._states.get(self.job_id, refresh=True) in ("CANCELLED", "VANISHED") and not self._has_result():
            self._cancelled = True
            self._states.forget(self.job_id)
            return True
        return False


class SlurmExecutor:
    """Submits cases as Slurm job arrays with submitit; see the module docstring.

    Its jobs are named ``topk-bench-<token>`` and log into ``log_dir/run-<token>/<job>/`` (``token``: this
    executor's own), so that a journal's job is told apart from another job that reuses its id.
    ``journal``: where submitted jobs are written down (:mod:`.slurm_journal`); ``adopt``: whether jobs an
    earlier run left there may be adopted (not after ``--no-resume``, nor with rounds: then they are
    only cancelled).
    """

    # The runner then submits the whole suite as one array and cancels (pending) larger
    # sizes after a failure, instead of submitting one size at a time.
    prefers_batches = True

    def __init__(
        self,
        settings,
        run: CaseRunner | None = None,
        poll_s: float = 1.0,
        journal: Path | None = None,
        adopt: bool = True,
        stuck_after_s: float = slurm_jobs.STUCK_AFTER_S,
    ):
        if not settings.log_dir:
            raise BadInput("expected a log folder shared with the compute nodes", key="executor.log_dir")
        self.settings = settings
        token = secrets.token_hex(4)
        self.name = f"topk-bench-{token}"
        self.folder = Path(settings.log_dir).resolve() / f"run-{token}"
        self._run = run  # pickled into each job: a module-level function importable on the nodes
        self._states = JobStates(poll_s, stuck_after_s)
        self._handles: list[SlurmHandle] = []
        self._journal = Journal(journal) if journal is not None else None
        self._left = list(self._journal.found) if self._journal is not None else []  # an earlier run's jobs
        self._left_states: dict[str, tuple[str, str]] | None = None  # (state, name) of those, asked once
        self._adopt = adopt

    def submit(self, cases: Sequence[Case], budget: Budget) -> list[SlurmHandle]:
        """Handles in the order of ``cases``: an earlier run's job of the same case and budget where one is
        still alive or finished with a result, else a new array task (one array per kind of request)."""
        if not cases:
            return []
        budget_json = budget.to_json()
        handles: list[SlurmHandle | None] = [self._adopted(case.to_json(), budget_json) for case in cases]
        self._cancel_left()  # the runner submits every case it has at once: what was not adopted now, never is
        by_request = collections.defaultdict(list)
        for i, case in enumerate(cases):
            if handles[i] is None:
                by_request[request(case, self.settings)].append(i)
        for asked, indices in sorted(by_request.items()):
            for start in range(0, len(indices), MAX_ARRAY):
                chunk = indices[start : start + MAX_ARRAY]
                for i, job in zip(chunk, self._submit_array(asked, [cases[i].to_json() for i in chunk], budget_json)):
                    handles[i] = SlurmHandle(job, self._states)
        submitted = [h for h in handles if h is not None]
        self._states.watch(h.job_id for h in submitted)
        self._handles.extend(submitted)
        return submitted

    def _submit_array(self, asked, case_jsons: list[str], budget_json: str) -> list:
        pattern = self.folder / "%j"
        executor = submitit.SlurmExecutor(folder=pattern)
        executor.update_parameters(**sbatch_parameters(self.settings, asked, self.name))
        try:
            jobs = executor.map_array(
                run_in_job, case_jsons, [budget_json] * len(case_jsons), [self._run] * len(case_jsons)
            )
        except Exception as exc:  # noqa: BLE001 -- sbatch refused (bad partition, no controller...): the user's
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            raise BadInput(
                f"sbatch refused the jobs ({lines[-1].removeprefix('sbatch: error: ')}); check "
                "partition, gpus_per_node, cpus_per_task, mem_gb and timeout_min",
                key="executor",
            ) from None
        if self._journal is not None:
            self._journal.add(
                Entry(job.job_id, self.name, str(pattern), case, budget_json) for job, case in zip(jobs, case_jsons)
            )
        return jobs

    def _left_state(self, entry: Entry) -> str:
        """The state of an earlier run's job, "" unless it is that job (its name) and Slurm still knows it."""
        if self._left_states is None:
            self._left_states = (
                slurm_jobs.names(sorted({e.job_id.split("_")[0] for e in self._left})) if self._left else {}
            )
        state, name = self._left_states.get(entry.job_id, ("", ""))
        return state if name == entry.name else ""

    def _adopted(self, case_json: str, budget_json: str) -> SlurmHandle | None:
        """A handle on an earlier run's job of this case and budget, if one may still give its result."""
        if not self._adopt:
            return None
        for entry in [e for e in self._left if e.key == (case_json, budget_json)]:
            handle = SlurmHandle(submitit.SlurmJob(folder=entry.folder, job_id=entry.job_id), self._states)
            if handle._has_result() or self._left_state(entry) in ACTIVE_STATES:
                self._left.remove(entry)
                return handle
        return None

    def _cancel_left(self) -> None:
        """Cancel the earlier run's jobs not adopted that are still alive (they would compete with ours)."""
        alive = [e.job_id for e in self._left if self._left_state(e) in ACTIVE_STATES]
        for start in range(0, len(alive), 500):
            command(["scancel", *alive[start : start + 500]])
        self._left.clear()

    def progress(self) -> str:
        """What the jobs do now, for the progress line: ``slurm: 3 pending (Resources), 1 running``."""
        pending, running, reasons = self._states.counts()
        why = ", ".join(reason + (f" x{n}" if n > 1 else "") for reason, n in reasons.most_common(2))
        return f"slurm: {pending} pending" + (f" ({why})" if why else "") + f", {running} running"

    def stuck(self) -> str | None:
        """Why the run cannot go on (a job waits for a reason that does not clear), or None."""
        found = self._states.stuck()
        if found is None:
            return None
        job_id, reason = found
        partition = self.settings.partition or "the default partition"
        return (
            f"slurm job {job_id} cannot start: it waits for {reason!r} ({partition}), which does not clear by "
            "itself; the rows already written are kept, a resume runs the rest"
        )

    def close(self) -> None:
        """Cancel every job not finished (after Ctrl-C nobody would collect their results, and a
        cluster allocation left running is wasted: a re-run resumes them), and the jobs an earlier run
        left that this one did not adopt; the journal goes."""
        unfinished = [h.job_id for h in self._handles if not h.done()]
        for start in range(0, len(unfinished), 500):
            command(["scancel", *unfinished[start : start + 500]])
        self._cancel_left()
        self._handles.clear()
        if self._journal is not None:
            self._journal.remove()
