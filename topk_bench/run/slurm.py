"""Run cases as jobs on a Slurm cluster through submitit (``--executor slurm``).

Each ``submit`` call becomes one job array (one array task per case). A task
runs ``run_in_job``, which measures its case through the same entry point as
the local executor (``topk_bench.run.launcher.run_isolated``: a child process per
case, forked from a warm template on the node), so a crash or a per-case
timeout inside the job is a normal ``Measurement`` returned through submitit's
result pickle, exactly as locally.
When the job itself dies (cancelled, node failure, killed for memory or for
Slurm's time limit) there is no result pickle: the handle turns the job's final
Slurm state into a ``crashed`` or ``timeout`` Measurement whose ``error`` holds
the tail of the job's log.

The parent only submits, polls and collects: it stays the only writer of the CSV.
Job states come from ``squeue`` (which also lists recently finished jobs, for
``MinJobAge`` seconds), and from ``sacct`` for jobs ``squeue`` has forgotten,
so the executor works on clusters without accounting (``sacct`` disabled).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.run.launcher import CaseRunner, run_isolated
from topk_bench.status import Status
from topk_bench.types import DeviceKind

try:  # optional dependency; get_executor turns this ImportError into one line of bad input
    import submitit
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"submitit is not installed ({exc}); pip install 'topk-bench[slurm]'") from exc


# Slurm states in which a job may still produce its result.
ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
    "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD",
})
TIMEOUT_STATES = frozenset({"TIMEOUT", "DEADLINE"})
# Default MaxArraySize is 1001: larger suites are split into several arrays.
MAX_ARRAY = 1000
LOG_TAIL_CHARS = 2000
# A submitted job that squeue and sacct never list within this time is given up as lost.
NEVER_SEEN_S = 120.0
# submitit requeues a preempted job; one still PREEMPTED after this long will not come back.
REQUEUE_GRACE_S = 120.0


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


class JobStates:
    """Slurm state of submitted jobs, refreshed at most every ``poll_s`` seconds
    with one ``squeue`` call for all of them (thousands of ``done()`` calls
    must not become thousands of commands)."""

    def __init__(self, poll_s: float = 1.0):
        self.poll_s = poll_s
        self._states: dict[str, str] = {}
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

    def get(self, job_id: str, refresh: bool = False) -> str:
        """The job's state, ``UNKNOWN`` if Slurm knows nothing of it (yet or anymore)."""
        with self._lock:
            if refresh or time.monotonic() - self._last >= self.poll_s:
                self._refresh()
            return self._states.get(job_id, "UNKNOWN")

    def _refresh(self) -> None:
        self._last = time.monotonic()
        pending = {j for j in self._watched if self._states.get(j, "UNKNOWN") in ACTIVE_STATES | {"UNKNOWN"}}
        if not pending:
            return
        arrays = sorted({j.split("_")[0] for j in pending})
        found = _squeue(arrays)
        if found is None:  # controller unreachable: keep what we knew, ask again later
            return
        missing = [j for j in pending if j not in found]
        if missing:
            found.update(_sacct(sorted({j.split("_")[0] for j in missing})))
        for job_id in pending:
            # A whole array ended before its tasks were split (e.g. cancelled while pending) is one record "123".
            state = found.get(job_id) or found.get(job_id.split("_")[0])
            if state:
                self._states[job_id] = state
            elif self._states.get(job_id) in ACTIVE_STATES or self._last - self._watched[job_id] > NEVER_SEEN_S:
                # Purged before we saw it end (no accounting), or never listed at all.
                self._states[job_id] = "VANISHED"


def _run(command: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _parse_states(text: str) -> dict[str, str]:
    states = {}
    for line in text.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id and state and "." not in job_id:  # skip job steps (123.batch)
            # sacct prints "CANCELLED by 0"; squeue prints "CANCELLED".
            states[job_id] = state.split()[0].rstrip("+")
    return states


def _squeue(array_ids: Sequence[str]) -> dict[str, str] | None:
    """States of the array tasks of ``array_ids`` (``-r``: one line per task, pending ones too)."""
    proc = _run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(array_ids)])
    if proc is None:
        return None
    if proc.returncode != 0:
        # All ids unknown to the controller (purged after MinJobAge) is an answer, not a failure.
        return {} if "Invalid job id" in proc.stderr else None
    return _parse_states(proc.stdout)


def _sacct(array_ids: Sequence[str]) -> dict[str, str]:
    proc = _run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(array_ids)])
    if proc is None or proc.returncode != 0:  # e.g. "Slurm accounting storage is disabled"
        return {}
    return _parse_states(proc.stdout)


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
    """One case = one array task."""

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
        if state in ("COMPLETED", "PREEMPTED"):
            # COMPLETED: the result pickle is on its way through the shared filesystem (or never comes).
            # PREEMPTED: submitit is about to requeue it.
            self._ended_at = self._ended_at or time.monotonic()
            grace = self._settle_s if state == "COMPLETED" else REQUEUE_GRACE_S
            return time.monotonic() - self._ended_at > grace
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
                return Measurement.from_json(self.job.result())
            except Exception as exc:  # the job function raised (e.g. topk_bench not importable on the node)
                # submitit's own handler of Slurm's pre-time-limit signal ends the job this way.
                status = Status.TIMEOUT if "timed-out" in str(exc) else Status.CRASHED
                return Measurement(status=status, error=f"{type(exc).__name__}: {str(exc)[-LOG_TAIL_CHARS:]}",
                                   metadata=meta)
        state = self._states.get(self.job_id, refresh=True)
        status = Status.TIMEOUT if state in TIMEOUT_STATES else Status.CRASHED
        return Measurement(status=status, error=f"slurm job {self.job_id} ended {state} without a result; "
                                                f"log tail:\n{log_tail(self.job)}", metadata=meta)

    def cancel(self) -> bool:
        """Cancel if still pending. (Not ``scancel --state=PENDING``: on an array whose
        tasks are all pending, Slurm 22.05 applies it to the whole array.)"""
        if self._cancelled:
            return True
        if self.done() or self._states.get(self.job_id, refresh=True) != "PENDING":
            return False
        _run(["scancel", self.job_id])
        # A pending array task cancelled before Slurm split it off leaves no record (VANISHED).
        # If it started in between, it ran for a moment at most: still never measured.
        if self._states.get(self.job_id, refresh=True) in ("CANCELLED", "VANISHED") and not self._has_result():
            self._cancelled = True
            self._states.forget(self.job_id)
            return True
        return False


def needs_gpu(case: Case) -> bool:
    """Whether the case's job must be given a GPU: measured on CUDA. Predicting and CPU cases need none
    (and a cluster without GPUs configured refuses a job that asks for one)."""
    return case.measured_on(DeviceKind.CUDA)


def sbatch_parameters(settings, *, gpu: bool) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters from ``ExecutorSettings`` (``[executor]`` of bench.toml).

    ``timeout_min`` is the Slurm time limit of each case's job: a backstop above
    the per-case budget, which the child process in the job enforces as locally.
    ``gpus_per_node`` is asked for only when ``gpu`` (the jobs' cases run on CUDA: :func:`needs_gpu`).
    """
    params: dict[str, Any] = {
        "job_name": "topk-bench",
        "time": settings.timeout_min,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": settings.cpus_per_task,
        "mem": f"{max(1, int(settings.mem_gb * 1024))}M",
        "array_parallelism": settings.array_parallelism,
        # submitit's warning signal before the time limit; it must come well after the
        # start, or submitit believes the job timed out at once.
        "signal_delay_s": min(90, settings.timeout_min * 15),
    }
    if settings.partition:
        params["partition"] = settings.partition
    if gpu and settings.gpus_per_node:
        params["gpus_per_node"] = settings.gpus_per_node
    if settings.extra_sbatch:
        # {"account": "abc", "exclusive": true} -> #SBATCH --account=abc / --exclusive
        params["additional_parameters"] = {k.replace("-", "_"): v for k, v in settings.extra_sbatch.items()}
    return params


class SlurmExecutor:
    """Submits cases as Slurm job arrays with submitit; see the module docstring."""

    # The runner then submits the whole suite as one array and cancels (pending) larger
    # sizes after a failure, instead of submitting one size at a time.
    prefers_batches = True

    def __init__(self, settings, run: CaseRunner | None = None, poll_s: float = 1.0):
        if not settings.log_dir:
            raise BadInput("expected a log folder shared with the compute nodes", key="executor.log_dir")
        self.settings = settings
        self.folder = Path(settings.log_dir).resolve()
        self._run = run  # pickled into each job: a module-level function importable on the nodes
        self._states = JobStates(poll_s)
        self._handles: list[SlurmHandle] = []

    def submit(self, cases: Sequence[Case], budget: Budget) -> list[SlurmHandle]:
        """One job array per kind of case (GPU or not: :func:`needs_gpu`), handles in the order of ``cases``."""
        if not cases:
            return []
        budget_json = budget.to_json()
        handles: list[SlurmHandle | None] = [None] * len(cases)
        for gpu in (False, True):
            indices = [i for i, case in enumerate(cases) if needs_gpu(case) == gpu]
            if not indices:
                continue
            executor = submitit.SlurmExecutor(folder=self.folder / "%j")
            executor.update_parameters(**sbatch_parameters(self.settings, gpu=gpu))
            for start in range(0, len(indices), MAX_ARRAY):
                chunk = indices[start:start + MAX_ARRAY]
                try:
                    jobs = executor.map_array(run_in_job, [cases[i].to_json() for i in chunk],
                                              [budget_json] * len(chunk), [self._run] * len(chunk))
                except Exception as exc:  # sbatch refused (bad partition, no controller...): a user-facing problem
                    lines = str(exc).strip().splitlines() or [type(exc).__name__]
                    raise BadInput(f"sbatch refused the jobs ({lines[-1].removeprefix('sbatch: error: ')}); check "
                                   "partition, gpus_per_node, cpus_per_task, mem_gb and timeout_min",
                                   key="executor") from None
                for i, job in zip(chunk, jobs):
                    handles[i] = SlurmHandle(job, self._states)
        submitted = [h for h in handles if h is not None]
        self._states.watch(h.job_id for h in submitted)
        self._handles.extend(submitted)
        return submitted

    def close(self) -> None:
        """Cancel every job not finished: after Ctrl-C nobody would collect their results,
        and a cluster allocation left running is wasted (a re-run resumes them)."""
        unfinished = [h.job_id for h in self._handles if not h.done()]
        for start in range(0, len(unfinished), 500):
            _run(["scancel", *unfinished[start:start + 500]])
        self._handles.clear()
