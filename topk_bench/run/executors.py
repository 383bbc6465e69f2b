"""Where cases run: the executor interface, the local executor, and choosing one from settings.

The runner submits a case once no smaller size of its implementation is still
pending (so that after an ``oom`` the larger sizes are skipped, never run), in
the order it wants them measured, and polls the handles. An executor whose
class sets ``prefers_batches = True`` (Slurm: one job array) gets every case at
once instead, and the runner cancels what the skip-larger rule removes. The
runner is the only writer of the results CSV: executors only return
``Measurement``s.

The interface (what a new executor, e.g. ``topk_bench.run.slurm.SlurmExecutor``, implements):

- ``executor.submit(cases: list[Case], budget: Budget) -> list[Handle]`` — one
  handle per case, same order. May be called more than once.
- ``handle.done() -> bool`` — finished (measured, failed or cancelled); never blocks.
- ``handle.result() -> Measurement`` — blocks until done; never raises for a failing
  case: a failure is a status (``crashed``, ``error``, ``timeout``...). It raises
  ``BadInput`` when no case can run at all (the local scratch directory is full), which
  ends the run (exit 2) with no row for that case. Only called on handles that were not
  cancelled.
- ``handle.cancel() -> bool`` — True if the case never ran and now never will
  (the runner then writes a ``skipped`` row or nothing); False if it already
  started or finished (its result is still collected).
- ``executor.close()`` — cancel what has not started and release resources;
  called once, also after Ctrl-C.
- optional, for executors whose cases may wait for resources (Slurm): ``executor.progress() -> str``,
  what the cases do now (shown on the progress line when it changes), and ``executor.stuck() -> str |
  None``, why the run cannot go on (the runner then ends it with that line, keeping the rows written).

A Slurm executor is built as ``SlurmExecutor(settings)`` with the
``ExecutorSettings`` of ``topk_bench.suite.settings`` (partition, gpus_per_node, ...).
"""

from __future__ import annotations

import collections
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.run import devices
from topk_bench.run.launcher import CaseRunner, run_isolated
from topk_bench.status import Status


class Handle(Protocol):
    def done(self) -> bool: ...
    def result(self) -> Measurement: ...
    def cancel(self) -> bool: ...


class Executor(Protocol):
    def submit(self, cases: Sequence[Case], budget: Budget) -> Sequence[Handle]: ...
    def close(self) -> None: ...


class LocalHandle:
    """A case queued on a :class:`LocalExecutor`: pending, running, then done (or cancelled)."""

    def __init__(self, case: Case, budget: Budget, lock: threading.Condition):
        self.case = case
        self.budget = budget
        self._lock = lock
        self._finished = threading.Event()
        self._started = False
        self._cancelled = False
        self._result: Measurement | None = None
        self._raised: BadInput | None = None  # no case can run here (a full TMPDIR): the runner stops

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self) -> Measurement:
        self._finished.wait()
        if self._raised is not None:
            raise self._raised
        if self._result is None:  # cancelled: the runner never asks, but stay total
            return Measurement(status=Status.SKIPPED, error="cancelled before it ran")
        return self._result

    def cancel(self) -> bool:
        # The executor's lock makes "take the next pending case" and "cancel" exclusive.
        with self._lock:
            if self._started or self._finished.is_set():
                return False
            self._cancelled = True
            self._finished.set()
            return True


class LocalExecutor:
    """Runs cases as child processes on this machine, at most ``jobs`` at once, in submission order.

    Each case goes through ``run`` (by default ``topk_bench.run.launcher.run_isolated``,
    which forks one child per case from the warm template all jobs share); the threads
    here only wait on those children, so they are daemon threads: Ctrl-C never waits
    for a case to end. ``slots``: per job slot, variables for its children
    (``run(case, budget, env=...)``), e.g. its GPU (:mod:`topk_bench.run.devices`).
    """

    def __init__(self, jobs: int = 1, run: CaseRunner | None = None, slots: Sequence[Mapping[str, str]] | None = None):
        if jobs < 1:
            raise BadInput(f"expected at least 1, got {jobs}", key="jobs")
        if slots is not None and len(slots) != jobs:
            raise ValueError(f"expected the variables of {jobs} slots, got {len(slots)}")
        self.jobs = jobs
        self._run = run
        self._slots = slots
        self._queue: collections.deque[LocalHandle] = collections.deque()
        self._wakeup = threading.Condition()
        self._closed = False
        self._threads: list[threading.Thread] = []

    def _run_fn(self) -> CaseRunner:
        return self._run or run_isolated

    def submit(self, cases: Sequence[Case], budget: Budget) -> list[LocalHandle]:
        run = self._run_fn()
        handles = [LocalHandle(case, budget, self._wakeup) for case in cases]
        with self._wakeup:
            if self._closed:
                raise RuntimeError("executor is closed")
            self._queue.extend(handles)
            self._wakeup.notify_all()
        while len(self._threads) < self.jobs:
            env = self._slots[len(self._threads)] if self._slots is not None else None
            thread = threading.Thread(target=self._work, args=(run, env), daemon=True, name="topk-bench-local")
            thread.start()
            self._threads.append(thread)
        return handles

    def _next(self) -> LocalHandle | None:
        with self._wakeup:
            while True:
                while self._queue:
                    handle = self._queue.popleft()
                    if not handle._cancelled:
                        handle._started = True
                        return handle
                if self._closed:
                    return None
                self._wakeup.wait()

    def _work(self, run: CaseRunner, env: Mapping[str, str] | None) -> None:
        while (handle := self._next()) is not None:
            try:
                handle._result = run(handle.case, handle.budget, env=env) if env else run(handle.case, handle.budget)
            except BadInput as exc:
                handle._raised = exc
            except BaseException as exc:  # noqa: BLE001 -- run_isolated never raises; a replacement might
                handle._result = Measurement(
                    status=Status.ERROR,
                    error=f"{type(exc).__name__}: {exc}",
                    metadata={"traceback": traceback.format_exc(limit=5)},
                )
            handle._finished.set()

    def close(self) -> None:
        with self._wakeup:
            self._closed = True
            pending, self._queue = list(self._queue), collections.deque()
            for handle in pending:
                if not handle._started:
                    handle._cancelled = True
                    handle._finished.set()
            self._wakeup.notify_all()


def get_executor(
    settings, run: CaseRunner | None = None, gpus: Sequence[str] = (), journal: Path | None = None, adopt: bool = True
) -> Executor:
    """The executor ``settings.kind`` names (``ExecutorSettings`` of bench.toml); ``gpus``: those a local
    measured CUDA run spreads its job slots over (Slurm gives each task its own); ``journal``, ``adopt``:
    where a Slurm executor writes down its jobs, and whether it may adopt an earlier run's
    (:mod:`topk_bench.run.slurm.journal`)."""
    if settings.kind == "local":
        return LocalExecutor(jobs=settings.jobs, run=run, slots=devices.slot_environments(settings.jobs, gpus))
    if settings.kind == "slurm":
        return _slurm().SlurmExecutor(settings, journal=journal, adopt=adopt)
    raise BadInput(f"expected 'local' or 'slurm', got {settings.kind!r}", key="executor.kind")


def _slurm():
    try:
        from topk_bench.run.slurm import executor as slurm  # optional: needs submitit
    except ImportError as exc:
        raise BadInput(f"slurm executor not available ({exc})", key="executor.kind") from None
    return slurm


def check_requests(settings, cases: Sequence[Case]) -> None:
    """Before a run touches anything: BadInput when the executor could never run a case (Slurm: a request
    no node of the partition can satisfy, :func:`topk_bench.run.slurm.requests.check`)."""
    if settings.kind == "slurm" and cases:
        _slurm()
        from topk_bench.run.slurm.requests import check

        check(cases, settings)
