"""The local executor: bounded parallelism, submission order, cancel semantics, failures as statuses."""

from __future__ import annotations

import threading
import time

import pytest

from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.run.executors import LocalExecutor, get_executor
from topk_bench.suite.settings import ExecutorSettings


def cases(n: int) -> list[Case]:
    return [Case.make(suite="s", workload="mha", impl="vanilla", params={"seq_len": 16 * (i + 1)}) for i in range(n)]


def wait(handles, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not all(h.done() for h in handles):
        assert time.monotonic() < deadline
        time.sleep(0.005)


class Gate:
    """A run function whose cases block until released, recording the order they started in."""

    def __init__(self):
        self.started: list[int] = []
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.active = self.max_active = 0

    def __call__(self, case: Case, budget: Budget) -> Measurement:
        with self.lock:
            self.started.append(case.param_dict["seq_len"])
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.release.wait(10)
        with self.lock:
            self.active -= 1
        return Measurement(status="ok", peak_bytes=case.param_dict["seq_len"])


@pytest.mark.parametrize("jobs", [1, 3])
def test_runs_at_most_jobs_cases_at_once_in_submission_order(jobs):
    gate = Gate()
    executor = LocalExecutor(jobs=jobs, run=gate)
    handles = executor.submit(cases(6), Budget())
    time.sleep(0.1)
    assert gate.active == jobs and not any(h.done() for h in handles)
    gate.release.set()
    wait(handles)
    executor.close()
    assert gate.max_active == jobs
    assert gate.started[:jobs] == [16 * (i + 1) for i in range(jobs)]
    assert [h.result().peak_bytes for h in handles] == [16 * (i + 1) for i in range(6)]


def test_cancel_is_true_only_for_a_case_that_never_started():
    gate = Gate()
    executor = LocalExecutor(jobs=1, run=gate)
    first, second, third = executor.submit(cases(3), Budget())
    time.sleep(0.1)
    assert first.cancel() is False  # running
    assert second.cancel() is True and second.done()
    gate.release.set()
    wait([first, third])
    assert third.cancel() is False  # finished
    assert sorted(gate.started) == [16, 48]  # the cancelled case never ran
    executor.close()


def test_close_cancels_what_has_not_started():
    gate = Gate()
    executor = LocalExecutor(jobs=1, run=gate)
    handles = executor.submit(cases(4), Budget())
    time.sleep(0.1)
    executor.close()
    assert all(h.done() for h in handles[1:]) and not handles[0].done()
    gate.release.set()
    wait(handles[:1])
    assert gate.started == [16]


def test_an_exception_of_the_run_function_is_an_error_status():
    def boom(case, budget):
        raise RuntimeError("launcher bug")

    executor = LocalExecutor(run=boom)
    (handle,) = executor.submit(cases(1), Budget())
    wait([handle])
    assert handle.result().status == "error" and "launcher bug" in handle.result().error
    executor.close()


def test_get_executor_builds_local_and_rejects_zero_jobs():
    executor = get_executor(ExecutorSettings(jobs=2))
    assert isinstance(executor, LocalExecutor) and executor.jobs == 2
    with pytest.raises(BadInput, match="jobs"):
        LocalExecutor(jobs=0)


def test_slurm_without_its_module_is_bad_input(monkeypatch):
    import sys

    import topk_bench.run.slurm

    monkeypatch.setitem(sys.modules, "topk_bench.run.slurm.executor", None)  # as if the module were absent
    monkeypatch.delattr(topk_bench.run.slurm, "executor", raising=False)  # (and never imported)
    with pytest.raises(BadInput, match="slurm executor not available"):
        get_executor(ExecutorSettings(kind="slurm"))
