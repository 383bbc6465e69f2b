"""The Slurm executor's pure parts, without a cluster: requests, partition offers, pending reasons, statuses."""

from __future__ import annotations

import pytest

from topk_bench.case import Case
from topk_bench.run.slurm import jobs as slurm_jobs
from topk_bench.run.slurm.jobs import ENDED_AS, JobStates, stuck_reason
from topk_bench.run.slurm.requests import Request, _gpus
from topk_bench.status import INTERRUPTED, Status


@pytest.mark.parametrize(
    "gres, gpus",
    [
        ("(null)", 0),
        ("gpu:2", 2),
        ("gpu:a100:4(S:0-1)", 4),
        ("gpu:a100:2,gpu:v100:1", 3),
        ("shard:8", 0),
    ],
)
def test_gpus_of_a_node_are_read_from_its_gres(gres, gpus):
    assert _gpus(gres) == gpus


def test_a_request_says_what_it_asks():
    assert Request(1, 2048).describe() == "1 CPU, 2.0 GiB of memory"
    assert Request(4, 65536, 1).describe() == "4 CPUs, 64.0 GiB of memory and 1 GPU"
    assert Request(2, 1024).describe(gpus_too=True) == "2 CPUs, 1.0 GiB of memory and 0 GPUs"


@pytest.mark.parametrize(
    "reason, stuck",
    [
        ("PartitionConfig", True),
        ("PartitionNodeLimit", True),
        ("InvalidQOS", True),
        ("InvalidAccount", True),
        ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions", True),
        ("ReqNodeNotAvail, UnavailableNodes:n1", True),
        ("JobHeldUser", True),
        ("Resources", False),
        ("Priority", False),
        ("BeginTime", False),
        ("JobArrayTaskLimit", False),
        ("None", False),
    ],
)
def test_which_pending_reasons_never_clear_by_themselves(reason, stuck):
    assert stuck_reason(reason) is stuck


def test_a_job_ending_without_a_result_becomes_the_status_of_what_happened_to_it():
    assert ENDED_AS["CANCELLED"] is Status.CANCELLED and ENDED_AS["PREEMPTED"] is Status.PREEMPTED
    assert ENDED_AS["NODE_FAIL"] is ENDED_AS["VANISHED"] is Status.LOST and ENDED_AS["TIMEOUT"] is Status.TIMEOUT
    assert "FAILED" not in ENDED_AS  # crashed
    assert INTERRUPTED == {Status.CANCELLED, Status.PREEMPTED, Status.LOST}


def test_a_stuck_reason_ends_the_run_only_once_it_lasted(monkeypatch):
    answers = iter([{"5_0": ("PENDING", "Resources"), "5_1": ("PENDING", "PartitionConfig")}] * 100)
    monkeypatch.setattr(slurm_jobs, "squeue", lambda ids: next(answers))
    clock = [100.0]
    monkeypatch.setattr(slurm_jobs.time, "monotonic", lambda: clock[0])
    states = JobStates(poll_s=0, stuck_after_s=10)
    states.watch(["5_0", "5_1"])
    assert states.stuck() is None  # seen now: it may be passing
    assert states.counts() == (2, 0, {"Resources": 1, "PartitionConfig": 1})
    clock[0] += 10
    assert states.stuck() == ("5_1", "PartitionConfig")
    states.forget("5_1")
    assert states.stuck() is None


def test_a_prediction_asks_one_cpu_whatever_bench_toml_says():
    from topk_bench.run.slurm.requests import request
    from topk_bench.suite.settings import ExecutorSettings

    settings = ExecutorSettings(kind="slurm", cpus_per_task=8, mem_gb=64, gpus_per_node=2)
    case = dict(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8})
    assert request(Case.make(**case, method="predicted", device="cuda"), settings) == Request(1, 2048, 0)
    assert request(Case.make(**case, device="cpu", threads=3), settings) == Request(3, 65536, 0)
    assert request(Case.make(**case, device="cuda", threads=None), settings) == Request(8, 65536, 2)


@pytest.mark.parametrize(
    "state, status",
    [
        ("CANCELLED", Status.CANCELLED),
        ("PREEMPTED", Status.PREEMPTED),
        ("NODE_FAIL", Status.LOST),
        ("COMPLETED", Status.CRASHED),
        ("FAILED", Status.CRASHED),
    ],
)
def test_a_case_crashed_by_its_jobs_cancellation_takes_the_jobs_fate(tmp_path, monkeypatch, state, status):
    """submitit's job process outlives Slurm's SIGTERM, which kills the case's template: its result says
    crashed. A job cancelled, preempted or lost: that fate, resumable; a job that completed or failed: crashed."""
    from types import SimpleNamespace

    from topk_bench.case import Measurement
    from topk_bench.run.slurm.executor import SlurmHandle

    pickle = tmp_path / "result.pkl"
    pickle.write_bytes(b"")
    crashed = Measurement(status=Status.CRASHED, error="the template process died (killed by SIGTERM)")
    job = SimpleNamespace(
        job_id="7_1", paths=SimpleNamespace(result_pickle=str(pickle)), result=lambda: crashed.to_json()
    )
    # A cancelled job is COMPLETING while Slurm's KillWait runs: its fate is read once it settled.
    answers = iter([{"7_1": ("COMPLETING", "")}] * 2 + [{"7_1": (state, "")}] * 100)
    monkeypatch.setattr(slurm_jobs, "squeue", lambda ids: next(answers))
    states = JobStates(poll_s=0)
    states.watch(["7_1"])
    row = SlurmHandle(job, states).result()
    assert row.status is status or row.status == status
    assert "killed by SIGTERM" in row.error
    if status in INTERRUPTED:
        assert f"({state})" in row.error and "a resume runs it again" in row.error
