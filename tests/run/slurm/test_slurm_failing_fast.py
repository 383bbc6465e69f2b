"""Slurm that fails fast (issue 29), on real local clusters (tests/slurm_clusters.py).

Requests sized per case and checked against the partition before anything is submitted; pending
reasons read (said while jobs wait; one that cannot clear ends the run); jobs cancelled, lost with
their node or preempted become rows with that status, which a resume runs again; a run killed without
cleaning up leaves its jobs to the next run, which adopts them; SIGHUP ends a run like Ctrl-C. The tests
that break a node do it on a private cluster, so that other sessions' jobs never see it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner_fakes import interruptible
from topk_bench.errors import BadInput
from topk_bench.results.store import read_rows
from topk_bench.run import runner
from topk_bench.run.resolve import Flags

pytestmark = pytest.mark.slow

# An implementation that waits while a file exists: a job that runs as long as the test wants.
PLUGIN = '''
import os, time
from topk_bench import attention
from topk_bench.attention import Implementation


def held(q, k, v, *, causal=False, activation="softmax", marker=""):
    """Waits while the file ``marker`` exists (ten minutes at most)."""
    end = time.time() + 600
    while marker and os.path.exists(marker) and time.time() < end:
        time.sleep(0.2)
    return q


if "test_held" not in attention.names():
    attention.register(Implementation("test_held", held, "waits while a file exists", options={"marker": ""}))
'''

SUITE = """
name = "held"
workload = "mha"
plugins = ["{plugin}"]
repeats = 1
warmup = 0
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = {sizes}
[[impl]]
name = "test_held"
marker = "{marker}"
"""


@pytest.fixture(autouse=True)
def _release(tmp_path):
    """Whatever a test leaves running on a cluster ends with it: its jobs wait on the marker."""
    yield
    (tmp_path / "hold").unlink(missing_ok=True)


def _files(tmp_path: Path, sizes=(16, 32, 64, 128), **executor) -> tuple[Path, Path, Path]:
    """(suite, bench.toml, marker): cases of ``test_held`` that wait while the marker exists (it does)."""
    plugin, marker = tmp_path / "held_plugin.py", tmp_path / "hold"
    plugin.write_text(PLUGIN)
    marker.write_text("")
    suite = tmp_path / "held.toml"
    suite.write_text(SUITE.format(plugin=plugin, marker=marker, sizes=list(sizes)))
    values = {
        "kind": "slurm",
        "gpus_per_node": 0,
        "cpus_per_task": 1,
        "mem_gb": 1,
        "timeout_min": 10,
        "log_dir": str(tmp_path / "slurm-logs"),
        **executor,
    }
    lines = ["[executor]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items() if not isinstance(v, dict)]
    for table, entries in ((k, v) for k, v in values.items() if isinstance(v, dict)):
        lines += [f"[executor.{table}]"] + [f"{k} = {json.dumps(v)}" for k, v in entries.items()]
    config = tmp_path / "bench.toml"
    config.write_text("\n".join(lines) + "\n")
    return suite, config, marker


def _cli(*args: str | Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "topk_bench", "run", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
        env={**os.environ, **(env or {})},
    )


def _jobs(tmp_path: Path) -> dict[str, str]:
    """{job id: state} of every job this test submitted (its batch script lies under ``tmp_path``), known to
    squeue (one line per array task, finished ones too for MinJobAge)."""
    proc = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%o"], capture_output=True, text=True, timeout=60
    )
    found = {}
    for line in proc.stdout.splitlines():
        job_id, state, script = line.split("|", 2)
        if str(tmp_path) in script:
            found[job_id] = state
    return found


def _until(what: str, condition, limit_s: float = 300.0, every_s: float = 0.5):
    """Wait for ``condition()`` to be truthy (generous: the test cluster may be busy); its value."""
    deadline = time.monotonic() + limit_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(every_s)
    return value


def _running(tmp_path: Path, at_least: int = 1) -> list[str]:
    """Wait until ``at_least`` of the test's jobs run; the ids of its jobs."""
    jobs = _until(
        f"{at_least} job(s) running",
        lambda: (found := _jobs(tmp_path)) and list(found.values()).count("RUNNING") >= at_least and found,
    )
    return sorted(jobs)


def _states(tmp_path: Path, job_ids) -> dict[str, str]:
    found = _jobs(tmp_path)
    return {j: found.get(j, "") for j in job_ids}


def _arrays(log_dir: Path) -> set[str]:
    """Every job array that ran with its logs in ``log_dir`` (submitit's folders ``<array>_<task>``)."""
    return {p.name.split("_")[0] for p in log_dir.rglob("*_*") if p.is_dir() and re.fullmatch(r"\d+_\d+", p.name)}


# ------------------------------------------------------------------------- requests sized and checked


def test_an_unsatisfiable_request_is_refused_before_anything_is_submitted(slurm_conf, tmp_path):
    suite, config, _ = _files(tmp_path, cpus_per_task=64)  # threads = "auto": on Slurm, cpus_per_task
    for asked in ("64 CPUs", "9766.0 GiB"):
        if "GiB" in asked:  # enough CPUs now, too much memory
            config.write_text(
                config.read_text()
                .replace("cpus_per_task = 64", "cpus_per_task = 1")
                .replace("mem_gb = 1", "mem_gb = 9766")
            )
        with pytest.raises(BadInput) as caught:
            runner.run(suite, Flags(out=tmp_path / "out", device="cpu"), config=config, progress=False)
        message = str(caught.value)
        assert caught.value.key == "executor" and asked in message and "offers at most 2 CPUs" in message, message
        assert "partition debug" in message and "nothing was submitted" in message
    assert not (tmp_path / "slurm-logs").exists() and not (tmp_path / "out").exists()  # not a job, not a file
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "topk_bench",
            "run",
            str(suite),
            "--config",
            str(config),
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("topk-bench: error: executor: a case's Slurm job asks 1 CPU, 9766.0 GiB")


def test_predict_on_slurm_asks_one_cpu_and_its_own_memory(slurm_conf, tmp_path):
    """bench.toml asks 2 CPUs and 20 GiB per job; a prediction's job asks 1 CPU and 2 GiB."""
    suite, config, marker = _files(tmp_path, sizes=(16,), cpus_per_task=2, mem_gb=20)
    marker.unlink()
    result = runner.run(suite, Flags(out=tmp_path / "out", predict=True), config=config, progress=False)
    assert [r["status"] for r in read_rows(result.csv_path)] == ["ok"]
    (script,) = (tmp_path / "slurm-logs").rglob("*_submission.sh")
    text = script.read_text()
    assert "#SBATCH --cpus-per-task=1\n" in text and "#SBATCH --mem=2048M\n" in text and "--no-requeue" in text


# ------------------------------------------------------------------------- pending reasons


def test_jobs_held_by_a_begin_time_are_said_while_the_run_waits(slurm_conf, tmp_path):
    """Red team: begin = "now+2hours" left the run silent. Now its progress line says why the jobs wait;
    Ctrl-C then ends it and cancels them."""
    suite, config, marker = _files(tmp_path, sizes=(16, 32), extra_sbatch={"begin": "now+2hours"})
    marker.unlink()
    proc = _cli(suite, "--config", config, "--out", tmp_path / "out", "--predict")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        _until(
            "a line saying the jobs wait for their begin time",
            lambda: any("slurm: 2 pending (BeginTime" in line for line in lines),
            limit_s=120,
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        proc.kill()
    _until("its jobs cancelled", lambda: set(_jobs(tmp_path).values()) == {"CANCELLED"}, limit_s=60)


def test_a_job_waiting_for_a_reason_that_cannot_clear_ends_the_run_keeping_its_rows(private_slurm, tmp_path):
    """The node drained mid-run: the jobs still pending wait for nodes that are down or drained; the run
    ends in bounded time with that reason in one line, the rows already written kept; a resume, once the
    node is back, completes the suite."""
    suite, config, marker = _files(tmp_path, sizes=(16, 32, 64), array_parallelism=1)
    out = tmp_path / "out"
    proc = _cli(suite, "--config", config, "--out", out, "--predict", "-q")
    try:
        _running(tmp_path)
        subprocess.run(["scontrol", "update", "nodename=localhost", "state=drain", "reason=test"], check=True)
        drained = time.monotonic()
        marker.unlink()  # the running job ends; the others cannot start
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    took = time.monotonic() - drained
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == [err.strip()] and "cannot start" in err and "DRAINED" in err, err
    assert took < 60, took
    rows = read_rows(out / "held.csv")
    assert [r["status"] for r in rows] == ["ok"]  # the job that ran: its row is kept
    assert not any(s in ("PENDING", "RUNNING") for s in _jobs(tmp_path).values())  # the rest cancelled
    subprocess.run(["scontrol", "update", "nodename=localhost", "state=resume"], check=True)
    result = runner.run(suite, Flags(out=out, predict=True), config=config, progress=False)
    assert [r["status"] for r in read_rows(result.csv_path)] == ["ok"] * 3


# ------------------------------------------------------------------------- jobs that end without a result


def test_scancel_of_a_running_array_gives_cancelled_rows_and_a_resume_completes_them(slurm_conf, tmp_path):
    """Red team: scancel gave crashed rows, and a resume ran 0 cases with no hint."""
    suite, config, marker = _files(tmp_path)
    out = tmp_path / "out"
    result: list = []
    run = threading.Thread(
        target=lambda: result.append(runner.run(suite, Flags(out=out, predict=True), config=config, progress=False)),
        daemon=True,
    )
    run.start()
    jobs = _running(tmp_path)
    subprocess.run(["scancel", jobs[0].split("_")[0]], check=True)  # the whole array, as an operator would
    run.join(300)
    rows = read_rows(out / "held.csv")
    assert [r["status"] for r in rows] == ["cancelled"] * 4, [(r["status"], r["error"]) for r in rows]
    assert all("scancel" in r["error"] and "a resume runs it again" in r["error"] for r in rows)
    marker.unlink()
    again = runner.run(suite, Flags(out=out, predict=True), config=config, progress=False)
    assert [r["status"] for r in read_rows(again.csv_path)] == ["ok"] * 4
    assert any("ran again 4 case(s) whose Slurm job was cancelled" in note for note in again.notes), again.notes


def test_a_node_set_down_mid_run_gives_lost_rows_that_a_resume_completes(private_slurm, tmp_path):
    """The running jobs die with their node (NODE_FAIL): rows ``lost``; the node comes back (ReturnToService)
    and the pending ones run. Jobs are not requeueable: Slurm never runs a case twice behind the run's back
    (scontrol requeue is refused), and no case gets two rows."""
    suite, config, marker = _files(tmp_path)
    out = tmp_path / "out"
    result: list = []
    run = threading.Thread(
        target=lambda: result.append(runner.run(suite, Flags(out=out, predict=True), config=config, progress=False)),
        daemon=True,
    )
    run.start()
    _running(tmp_path, at_least=2)
    running = [j for j, state in _jobs(tmp_path).items() if state == "RUNNING"]
    requeue = subprocess.run(["scontrol", "requeue", running[0]], capture_output=True, text=True)
    assert requeue.returncode != 0 and "disabled" in requeue.stderr, requeue.stderr
    subprocess.run(["scontrol", "update", "nodename=localhost", "state=down", "reason=test"], check=True)
    _until(
        "the running jobs failed with their node",
        lambda: all(_states(tmp_path, running)[j] == "NODE_FAIL" for j in running),
        limit_s=120,
    )
    marker.unlink()
    subprocess.run(["scontrol", "update", "nodename=localhost", "state=resume"], capture_output=True)
    run.join(600)
    rows = read_rows(out / "held.csv")
    statuses = sorted(r["status"] for r in rows)
    assert len(rows) == 4 and statuses.count("lost") == len(running) and statuses.count("ok") == 4 - len(running)
    assert all(
        "was lost (with its node" in r["error"] and "NODE_FAIL" in r["error"] for r in rows if r["status"] == "lost"
    )
    again = runner.run(suite, Flags(out=out, predict=True), config=config, progress=False)
    rows = read_rows(again.csv_path)
    assert [r["status"] for r in rows] == ["ok"] * 4 and len({r["case_id"] for r in rows}) == 4


# ------------------------------------------------------------------------- a parent that dies


def test_a_resume_adopts_the_jobs_of_a_run_killed_with_sigkill_instead_of_submitting_them_again(slurm_conf, tmp_path):
    """Red team: a parent killed by SIGKILL left its array running, its results thrown away, and a resume
    submitted a second array. Now the resume adopts the first array's jobs: one array in all, every row ok."""
    suite, config, marker = _files(tmp_path)
    out = tmp_path / "out"
    proc = _cli(suite, "--config", config, "--out", out, "--predict", "-q")
    try:
        jobs = _running(tmp_path)
        proc.kill()
        proc.wait(60)
    finally:
        proc.kill()
    assert any(state in ("PENDING", "RUNNING") for state in _states(tmp_path, jobs).values())  # its jobs go on
    threading.Timer(5.0, marker.unlink).start()  # the jobs end while the resume waits for them
    result = runner.run(suite, Flags(out=out, predict=True), config=config, progress=False)
    rows = read_rows(result.csv_path)
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert _arrays(tmp_path / "slurm-logs") == {jobs[0].split("_")[0]}  # no second array
    assert not (out / ".held.slurm-jobs.jsonl").exists()


def test_sighup_ends_the_run_like_ctrl_c_and_cancels_its_jobs(slurm_conf, tmp_path):
    """Red team: a parent killed by SIGHUP left its array running."""
    suite, config, _ = _files(tmp_path)
    out = tmp_path / "out"
    proc = _cli(suite, "--config", config, "--out", out, "--predict", "-q")
    try:
        _running(tmp_path)
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(60) == 130
    finally:
        proc.kill()
    _until("its jobs cancelled", lambda: set(_jobs(tmp_path).values()) == {"CANCELLED"}, limit_s=60)
