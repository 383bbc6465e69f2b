"""One child process per case: every failure status, and a parent that outlives its children."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from locations import ROOT
from topk_bench.case import Budget, Case
from topk_bench.child.execute import execute
from topk_bench.run.launcher import run_isolated

PLUGIN = str(ROOT / "tests" / "plugins" / "failing_impls.py")
MIB = 1 << 20
CHILD_ENV = {"OMP_NUM_THREADS": "1"}


def case(impl: str, **fields) -> Case:
    return Case.make(
        suite="isolation",
        workload="mha",
        impl=impl,
        params={"seq_len": 16, "d_model": 16, "heads": 2},
        plugins=(PLUGIN,),
        warmup=0,
        repeats=2,
        **fields,
    )


pytestmark = pytest.mark.usefixtures("single_thread")


# name -> (case, budget): run at once, each in its own child.
SCENARIOS = {
    "ok": (case("vanilla", causal=True), Budget(max_memory_bytes=64 * MIB, max_seconds=120)),
    "predicted": (case("vanilla", causal=True, method="predicted"), Budget()),
    "over_budget": (case("test_hog"), Budget(max_memory_bytes=64 * MIB)),
    "oom": (case("test_huge"), Budget()),
    "error": (case("test_raise"), Budget()),
    "exit": (case("test_exit"), Budget()),
    "timeout": (case("test_sleep"), Budget(max_seconds=1.0)),
    "crashed": (case("test_abort"), Budget()),
    "unsupported": (case("test_unpredictable", method="predicted"), Budget()),
}


@pytest.fixture(scope="module")
def results():
    with ThreadPoolExecutor(max_workers=len(SCENARIOS)) as pool:
        futures = {name: pool.submit(run_isolated, c, b, env=CHILD_ENV) for name, (c, b) in SCENARIOS.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.slow
def test_ok_in_a_child_matches_in_process(results):
    m = results["ok"]
    assert m.status == "ok", m.error
    assert m.peak_bytes == execute(SCENARIOS["ok"][0]).peak_bytes
    assert len(m.times_s) == 2 and m.metadata["child_startup_s"] > 0 and m.metadata["child_wall_s"] > 0
    assert {"torch_version", "cuda_version", "threads", "hostname", "git_sha"} <= set(m.metadata)
    assert m.metadata["threads"] == 1  # the child's environment (OMP_NUM_THREADS) was applied
    predicted = results["predicted"]
    assert predicted.status == "ok" and predicted.peak_bytes == m.peak_bytes


@pytest.mark.slow
def test_a_runs_first_case_does_not_carry_the_templates_start_up(tmp_path):
    # The template's imports, slowed here by 6 s in a sitecustomize that a forked child does not run again,
    # are the run's cost: wall_s (the row's, and the ETA's measure of a case) counts from the child's fork.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(6)\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    m = run_isolated(case("vanilla", causal=True), Budget(max_seconds=120), env={**CHILD_ENV, "PYTHONPATH": path})
    assert m.status == "ok", m.error
    assert m.metadata["child_startup_s"] >= 6
    assert m.metadata["child_wall_s"] < m.metadata["child_startup_s"], m.metadata


@pytest.mark.slow
def test_every_failure_status(results):
    statuses = {name: results[name].status for name in SCENARIOS}
    assert statuses == {
        "ok": "ok",
        "predicted": "ok",
        "over_budget": "over_budget",
        "oom": "oom",
        "error": "error",
        "exit": "error",
        "timeout": "timeout",
        "crashed": "crashed",
        "unsupported": "unsupported",
    }, {name: results[name].error for name in SCENARIOS}


@pytest.mark.slow
def test_failure_messages_say_what_happened(results):
    assert results["over_budget"].peak_bytes >= 256 * MIB
    assert "can't allocate memory" in results["oom"].error
    assert results["error"].error.startswith("ValueError: test_raise failed on purpose (at failing_impls.py:")
    assert "exited with code 3" in results["exit"].error
    assert "time budget of 1 s" in results["timeout"].error
    assert "SIGABRT" in results["crashed"].error
    assert "cannot be predicted" in results["unsupported"].error
    for m in results.values():
        assert m.metadata["torch_version"] and m.device_name


def test_execute_in_process_never_raises():
    assert execute(case("test_raise")).status == "error"
    assert execute(case("test_hog"), Budget(max_memory_bytes=64 * MIB)).status == "over_budget"
    assert execute(case("test_huge")).status == "oom"
    # With a memory budget a failed allocation is the case needing more than its budget.
    assert execute(case("test_huge"), Budget(max_memory_bytes=64 * MIB)).status == "over_budget"
    assert execute(case("test_unpredictable", method="predicted")).status == "unsupported"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (its parent, killed, cannot reap it; init will).
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_child_dies_with_a_killed_parent(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        from topk_bench.case import Budget, Case
        from topk_bench.run.launcher import run_isolated
        c = Case.make(suite="t", workload="mha", impl="test_sleep", params={{"seq_len": 8, "d_model": 8, "heads": 1}},
                      options={{"seconds": 120.0, "pid_file": {str(pid_file)!r}}}, plugins=({PLUGIN!r},),
                      warmup=0, repeats=1)
        run_isolated(c, Budget(max_seconds=300), env={{"OMP_NUM_THREADS": "1"}})
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert parent.poll() is None and time.monotonic() < deadline, "the child never started sleeping"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
