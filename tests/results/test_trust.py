"""How far to trust a time: the pure flag rule, the machine readings it takes, and a case measured on a busy machine."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from topk_bench import machine
from topk_bench.results import trust
from topk_bench.run.resolve import Flags


@pytest.mark.parametrize(
    "load_start, load_end, steal, time_cv, expected",
    [
        (0.2, 0.3, 0.0, 0.01, ""),
        (1.0, 1.0, 0.0, 0.10, ""),  # at the thresholds: not flagged
        (1.01, 0.2, None, None, "busy"),  # busy at the start only
        (0.2, 2.5, None, 0.02, "busy"),  # or at the end only
        (0.2, 0.2, 0.06, 0.02, "busy"),  # a hypervisor stole the CPU
        (0.2, 0.2, 0.0, 0.11, "noisy"),
        (3.0, 4.0, 0.0, 0.5, "busy;noisy"),
        (None, None, None, None, ""),  # nothing known (not Linux, one sample): not flagged
        (float("nan"), None, None, float("nan"), ""),
    ],
)
def test_flag_rule(load_start, load_end, steal, time_cv, expected):
    assert trust.flags(load_start=load_start, load_end=load_end, steal=steal, time_cv=time_cv) == expected


@pytest.mark.parametrize(
    "runnable, cpu_wait, cpu_share, expected",
    [
        (0.5, 0.02, 0.98, ""),
        (1.0, 0.25, 0.5, ""),  # at the thresholds: not flagged
        (1.5, 0.02, 0.98, "busy"),  # more runnable threads than cores while it ran
        (0.5, 0.26, 0.98, "contended"),  # a thread waited for a CPU a quarter of the median iteration
        (0.5, 0.02, 0.10, ""),  # run delay known and small: a low CPU share is idle threads
        (0.5, None, 0.49, "contended"),  # no run delay from the kernel: CPU time per thread instead
        (0.5, float("nan"), 0.9, ""),
        (2.0, 0.87, 0.14, "busy;contended"),  # issue 29's 55x decode step: flagged whatever the load said
    ],
)
def test_contention_rule(runnable, cpu_wait, cpu_share, expected):
    quiet = dict(load_start=0.2, load_end=0.2, steal=0.0, time_cv=0.01)
    assert trust.flags(**quiet, runnable=runnable, cpu_wait=cpu_wait, cpu_share=cpu_share) == expected
    assert trust.flags(
        **{**quiet, "time_cv": 0.5}, runnable=runnable, cpu_wait=cpu_wait, cpu_share=cpu_share
    ) == ";".join(filter(None, [expected, "noisy"]))


def test_flags_read_back_from_any_cell():
    assert trust.named("busy;contended") == {"busy", "contended"}
    assert trust.named("") == set() and trust.named(float("nan")) == set() and trust.named(3) == set()


def test_cv_needs_two_samples():
    assert trust.cv([1.0]) is None and trust.cv([]) is None
    assert trust.cv([1.0, 1.0, 1.0]) == 0.0
    assert trust.cv([1.0, 2.0, 3.0]) == pytest.approx(0.5)


def test_one_warning_line_counts_the_flagged_cases():
    assert trust.warning(["", "", float("nan")]) is None
    line = trust.warning(["busy", "", "busy;noisy", "noisy", "", "contended"])
    assert line.startswith("4 of 6 case(s) measured under contention: 2 on a busy machine")
    assert "1 whose threads waited for a CPU (contended)" in line
    assert "2 with noisy samples (CV above 10%)" in line
    # Not a dead end: it names the command that measures exactly those rows again (issue 30).
    assert line.endswith("measure them again on a quiet machine: topk-bench run SUITE --remeasure busy,contended,noisy")
    assert trust.warning(["noisy", ""]).endswith("topk-bench run SUITE --remeasure noisy")
    # With the runs that wrote them (their suite file and folder, results.frame.runs_of): those, named.
    named = trust.warning(["noisy"], ["suites/demo_time.toml --out results/demo"])
    assert named.endswith("topk-bench run suites/demo_time.toml --out results/demo --remeasure noisy")


def test_steal_share_between_two_readings(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3\n")
    start = machine.Reading(0.5, machine._cpu_times(stat))
    stat.write_text("cpu  200 0 100 1500 10 0 0 190 0 0\n")
    end = machine.Reading(0.7, machine._cpu_times(stat))
    assert machine.steal_share(start, end) == pytest.approx(150 / 1000)
    assert machine.context(start, end) == {"load_start": 0.5, "load_end": 0.7, "steal": pytest.approx(0.15)}
    stat.write_text("not a stat file\n")
    assert machine._cpu_times(stat) is None and machine.steal_share(start, machine.Reading(0.1, None)) is None


SPINNER = "import time\nend = time.time() + 300\nwhile time.time() < end: pass\n"
BUSY_SUITE = """
name = "busy"
workload = "mha"
causal = true
repeats = 3
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16]
[[impl]]
name = "vanilla"
"""


@pytest.mark.slow
def test_a_case_measured_while_the_machine_is_made_busy_is_flagged(tmp_path):
    """Spinning processes, three per core, until the 1-minute load average passes the threshold; then one real
    case (a child process measuring) must come out flagged busy, and run warns once before it starts."""
    from topk_bench.run import runner

    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER]) for _ in range(3 * machine.cores())]
    try:
        deadline = time.monotonic() + 150  # 3 per core: the average passes 1 per core within ~25 s from idle
        while machine.load_per_core() <= trust.BUSY_LOAD_PER_CORE:
            assert time.monotonic() < deadline, f"load stayed at {machine.load_per_core():.2f} per core"
            time.sleep(2)
        suite = tmp_path / "busy.toml"
        suite.write_text(BUSY_SUITE)
        plan = runner.plan(suite, Flags(out=tmp_path / "out", device="cpu"))
        assert "busy" in runner.busy_note(plan)
        result = runner.run(suite, Flags(out=tmp_path / "out", device="cpu", max_case_seconds=120), progress=False)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    from topk_bench import load_results

    row = load_results(result.csv_path).iloc[0]
    assert row["status"] == "ok", row["error"]
    assert "busy" in row["trust"].split(";")
    assert max(row["load_start"], row["load_end"]) > trust.BUSY_LOAD_PER_CORE
