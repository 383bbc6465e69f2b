"""The Slurm executor against a real Slurm: Debian's slurm-wlm started on localhost (tests/slurm_clusters.py)."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_clusters import REPO
from topk_bench.case import Budget, Case
from topk_bench.results.store import read_rows
from topk_bench.run import runner
from topk_bench.run.resolve import Flags
from topk_bench.suite.settings import ExecutorSettings

# Every test here drives a real (local) Slurm cluster.
pytestmark = pytest.mark.slow


def _bench_toml(tmp_path: Path, **executor) -> Path:
    """A bench.toml whose [executor] fits the one-node test cluster (no GPU, 2 CPUs)."""
    values = {
        "partition": "",
        "gpus_per_node": 0,
        "cpus_per_task": 1,
        "mem_gb": 1,
        "timeout_min": 5,
        "log_dir": str(tmp_path / "slurm-logs"),
        **executor,
    }
    lines = ["[executor]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in values.items() if v != ""]
    path = tmp_path / "bench.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _by_case(csv: Path) -> dict[str, dict[str, str]]:
    return {row["case_id"]: row for row in read_rows(csv)}


@pytest.mark.timeout(900)
def test_smoke_suite_through_slurm_matches_local(slurm_conf, tmp_path):
    config = _bench_toml(tmp_path)
    # A generous time budget: on a loaded machine a slow child must not turn into a timeout in one run only.
    common = dict(config=config, resume=False, progress=False)
    local = runner.run(
        REPO / "suites/smoke.toml",
        Flags(out=tmp_path / "local", executor="local", predict=True, max_case_seconds=600),
        **common,
    )
    slurm = runner.run(
        REPO / "suites/smoke.toml",
        Flags(out=tmp_path / "slurm", executor="slurm", predict=True, max_case_seconds=600),
        **common,
    )

    local_rows, slurm_rows = _by_case(local.csv_path), _by_case(slurm.csv_path)
    assert len(local_rows) == len(local.plan.cases) > 0
    assert slurm_rows.keys() == local_rows.keys()
    for case_id, row in local_rows.items():
        other = slurm_rows[case_id]
        assert (other["impl"], other["status"], other["peak_bytes"]) == (row["impl"], row["status"], row["peak_bytes"])
    # Every case went through a job: one submitit result per array task.
    assert len(list((tmp_path / "slurm-logs").glob("run-*/*_*/*_result.pkl"))) == len(slurm_rows)


@pytest.mark.timeout(900)
def test_case_crashing_in_its_job_is_recorded_and_the_rest_complete(slurm_conf, tmp_path):
    suite = tmp_path / "crash.toml"
    suite.write_text(
        textwrap.dedent(f"""
        name = "slurm_crash"
        workload = "mha"
        plugins = ["{REPO / "tests/plugins/failing_impls.py"}"]
        repeats = 1
        warmup = 0
        [shape]
        batch = 1
        d_model = 32
        heads = 2
        [sweep]
        seq_len = [16]
        [[impl]]
        name = "test_abort"
        [[impl]]
        name = "vanilla"
        [[impl]]
        name = "sdpa"
    """)
    )
    result = runner.run(
        suite,
        Flags(out=tmp_path / "out", executor="slurm", predict=True, max_case_seconds=600),
        config=_bench_toml(tmp_path),
        resume=False,
        progress=False,
    )
    rows = {row["impl"]: row for row in read_rows(result.csv_path)}
    assert rows["test_abort"]["status"] == "crashed"
    assert "SIGABRT" in rows["test_abort"]["error"]
    assert rows["vanilla"]["status"] == rows["sdpa"]["status"] == "ok"


@pytest.mark.timeout(900)
def test_rounds_through_slurm_pool_every_rounds_samples(slurm_conf, tmp_path):
    suite = tmp_path / "rounds.toml"
    suite.write_text(
        textwrap.dedent("""
        name = "slurm_rounds"
        workload = "mha"
        repeats = 2
        warmup = 0
        rounds = 2
        [shape]
        batch = 1
        d_model = 32
        heads = 2
        [sweep]
        seq_len = [16, 32]
        [[impl]]
        name = "vanilla"
    """)
    )
    result = runner.run(
        suite,
        Flags(out=tmp_path / "out", executor="slurm", device="cpu", max_case_seconds=600),
        config=_bench_toml(tmp_path),
        resume=False,
        progress=False,
    )
    rows = read_rows(result.csv_path)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert {r["repeats"] for r in rows} == {"4"}  # 2 rounds of 2 samples
    # Each round of each case went through a job of its own.
    assert len(list((tmp_path / "slurm-logs").glob("run-*/*_*/*_result.pkl"))) == 4


TINY_SUITE = """
name = "slurm_gpus"
workload = "mha"
repeats = 1
warmup = 0
[shape]
batch = 1
d_model = 32
heads = 2
[sweep]
seq_len = [16]
[[impl]]
name = "vanilla"
"""


@pytest.mark.timeout(900)
def test_gpus_are_asked_for_only_by_cases_measured_on_cuda(slurm_conf, tmp_path):
    """bench.toml's default gpus_per_node = 1 on a cluster without GPUs: a --predict run and a --device cpu
    run go through (no GPU asked for); a case measured on CUDA asks, and this cluster refuses it."""
    from topk_bench.errors import BadInput
    from topk_bench.run.slurm.executor import SlurmExecutor

    suite = tmp_path / "gpus.toml"
    suite.write_text(TINY_SUITE)
    config = _bench_toml(tmp_path, gpus_per_node=1)
    for how in (dict(predict=True), dict(device="cpu")):
        result = runner.run(
            suite,
            Flags(out=tmp_path / str(len(how)) / next(iter(how)), executor="slurm", max_case_seconds=600, **how),
            config=config,
            resume=False,
            progress=False,
        )
        rows = read_rows(result.csv_path)
        assert [(r["status"], r["method"], r["device"]) for r in rows] == [
            ("ok", "predicted" if "predict" in how else "measured", "cpu")
        ], rows
    settings = ExecutorSettings(
        kind="slurm", gpus_per_node=1, cpus_per_task=1, mem_gb=1, timeout_min=5, log_dir=str(tmp_path / "logs")
    )
    executor = SlurmExecutor(settings)
    cuda = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cuda")
    try:
        with pytest.raises(BadInput, match="sbatch refused"):  # the test cluster has no GPU: the ask is real
            executor.submit([cuda], Budget(max_seconds=30))
    finally:
        executor.close()


# ------------------------------------------------------ jobs that die, cancel

JOB_FUNCTIONS = '''
import os, time
from topk_bench.case import Measurement

def run(case, budget):
    """No torch: what matters here is what happens to the job, not the measurement."""
    if case.impl == "die":
        os.abort()  # kills the job's own process: no result pickle
    if case.impl == "hang":
        time.sleep(600)
    return Measurement(status="ok", peak_bytes=dict(case.params)["seq_len"])
'''


def _wait_state(handle, wanted: str, limit_s: float = 300.0) -> None:
    # Generous: the test cluster may be busy with jobs of other test sessions.
    deadline = time.monotonic() + limit_s
    while handle._states.get(handle.job_id, refresh=True) != wanted:
        assert time.monotonic() < deadline, f"job {handle.job_id} never reached {wanted}"
        time.sleep(0.3)


@pytest.mark.timeout(600)
def test_dead_jobs_become_rows_with_the_log_tail_and_pending_ones_cancel(slurm_conf, tmp_path, monkeypatch):
    from topk_bench.run.slurm.executor import SlurmExecutor

    (tmp_path / "slurm_test_jobs.py").write_text(JOB_FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    # The jobs import the function by name: they inherit this environment through sbatch.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    import slurm_test_jobs

    settings = ExecutorSettings(
        kind="slurm",
        gpus_per_node=0,
        cpus_per_task=1,
        mem_gb=1,
        timeout_min=5,
        array_parallelism=1,
        log_dir=str(tmp_path / "logs"),
    )
    executor = SlurmExecutor(settings, run=slurm_test_jobs.run, poll_s=0.2)
    cases = [
        Case.make(suite="t", workload="mha", impl=impl, params={"seq_len": n})
        for n, impl in enumerate(["fine", "die", "hang", "never"])
    ]
    try:
        fine, die, hang, never = executor.submit(cases, Budget(max_seconds=30))
        _wait_state(hang, "RUNNING")  # array_parallelism=1: "never" is still pending
        assert never.cancel() is True
        assert hang.cancel() is False  # already running: only pending tasks are cancelled
        subprocess.run(["scancel", hang.job_id], check=True)  # as an operator or a node failure would

        assert fine.result().status == "ok" and fine.result().peak_bytes == 0
        died = die.result()
        assert died.status == "crashed"
        assert "FAILED" in died.error and "Aborted" in died.error  # Slurm's state and srun's line from the log
        killed = hang.result()
        assert killed.status == "cancelled"  # issue 29: not a crash of the case; a resume runs it again
        assert "CANCELLED" in killed.error and "resume" in killed.error
        assert never.done() and never.result().status == "skipped"
    finally:
        executor.close()


# ------------------------------------------------------ no cluster needed


def test_state_parsing_and_sbatch_parameters():
    from topk_bench.run.slurm.jobs import parse_states
    from topk_bench.run.slurm.requests import Request, request, sbatch_parameters

    text = "12_0|COMPLETED|None\n12_1|CANCELLED by 0\n12_1.batch|CANCELLED\n13|TIMEOUT\n14_2|PENDING|BeginTime\n"
    assert parse_states(text) == {
        "12_0": ("COMPLETED", "None"),
        "12_1": ("CANCELLED", ""),
        "13": ("TIMEOUT", ""),
        "14_2": ("PENDING", "BeginTime"),
    }
    settings = ExecutorSettings(
        kind="slurm",
        partition="gpu",
        gpus_per_node=2,
        cpus_per_task=4,
        mem_gb=1.5,
        timeout_min=30,
        extra_sbatch={"account": "abc", "exclusive": True},
    )
    cuda = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cuda", threads=3)
    params = sbatch_parameters(settings, request(cuda, settings))
    assert params["partition"] == "gpu" and params["gpus_per_node"] == 2 and params["time"] == 30
    assert params["mem"] == "1536M" and params["cpus_per_task"] == 3  # the threads it runs with
    assert params["additional_parameters"] == {"no_requeue": True, "account": "abc", "exclusive": True}
    cpu = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cpu", threads=3)
    without = sbatch_parameters(settings, request(cpu, settings))
    assert "gpus_per_node" not in without and {k: v for k, v in params.items() if k != "gpus_per_node"} == without
    predicted = Case.make(
        suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cuda", method="predicted", threads=1
    )
    assert request(predicted, settings) == Request(1, 2048, 0)  # one CPU and its own needs, whatever bench.toml says


def test_only_cases_measured_on_cuda_need_a_gpu():
    from topk_bench.run.slurm.requests import needs_gpu

    def case(**fields):
        return Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, **fields)

    assert needs_gpu(case(device="cuda")) and needs_gpu(case(device="cuda:1"))
    assert not needs_gpu(case(device="cuda", method="predicted"))
    assert not needs_gpu(case(device="cpu")) and not needs_gpu(case(device="cpu", method="predicted"))


def test_job_killed_at_the_time_limit_is_a_timeout_with_its_log(tmp_path):
    from topk_bench.run.slurm.executor import SlurmHandle
    from topk_bench.run.slurm.jobs import JobStates

    log = tmp_path / "1_0_0_log.err"
    log.write_text("slurmstepd: error: *** JOB 5 ON n1 CANCELLED AT 2026-01-01 DUE TO TIME LIMIT ***\n")
    job = SimpleNamespace(
        job_id="1_0",
        paths=SimpleNamespace(
            folder=tmp_path, stderr=log, stdout=tmp_path / "none.out", result_pickle=tmp_path / "none.pkl"
        ),
    )
    states = JobStates(poll_s=0)
    states.get = lambda job_id, refresh=False: "TIMEOUT"
    measurement = SlurmHandle(job, states).result()
    assert measurement.status == "timeout"
    assert "DUE TO TIME LIMIT" in measurement.error and "TIMEOUT" in measurement.error
