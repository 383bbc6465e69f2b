"""``scripts/time_gate.py``, the CPU time gate of ``.ci/run``, judging real runs of ``suites/ci_time.toml`` (two
runs of the same code on one machine, tests/data/ci-time/): it passes them, fails a 1.3x slowdown injected into
one method, says inconclusive (and passes) where the failing rows were measured under contention, and passes
with one line where the CPU kind has no baseline."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from locations import ROOT, TESTS

DATA = TESTS / "data" / "ci-time"
BASE, RUN = DATA / "base.csv", DATA / "run.csv"
GATE = ROOT / "scripts" / "time_gate.py"


def gate(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GATE), *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})  # fmt: skip


def slowed(tmp_path, impl: str, workload: str, factor: float = 1.3, trust: str | None = None):
    """The run with every sample of one method ``factor`` times longer (its trust set to ``trust`` if given)."""
    frame = pd.read_csv(RUN, dtype=str, keep_default_na=False)
    rows = (frame["impl"] == impl) & (frame["workload"] == workload)
    assert rows.sum() == 1
    frame.loc[rows, "times_s"] = frame.loc[rows, "times_s"].map(
        lambda cell: ";".join(repr(float(t) * factor) for t in cell.split(";"))
    )
    if trust is not None:
        frame.loc[rows, "trust"] = trust
    path = tmp_path / "run.csv"
    frame.to_csv(path, index=False)
    return path


def test_the_data_are_two_real_runs_of_the_suite_on_one_cpu_kind():
    base, run = pd.read_csv(BASE), pd.read_csv(RUN)
    assert len(base) == len(run) == 7 and set(base.case_id) == set(run.case_id)
    assert (base.status == "ok").all() and (run.status == "ok").all() and (run["rounds"] == 7).all()
    assert base.cpu_capability.nunique() == 1 and set(base.cpu_flags) == set(run.cpu_flags)
    assert base.git_sha.iloc[0] == run.git_sha.iloc[0]  # the same code: their difference is the machine's noise


def test_two_runs_of_the_same_code_pass():
    done = gate("--results", RUN, "--baseline", BASE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "time gate (CPU kind" in done.stdout and ": passed" in done.stdout


@pytest.mark.parametrize(("impl", "workload"), [("page_topk", "decode"), ("topk_fast", "decode"), ("topk_fast", "mha")])
def test_a_1_3x_slowdown_of_one_method_fails_the_gate(tmp_path, impl, workload):
    done = gate("--results", slowed(tmp_path, impl, workload), "--baseline", BASE)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED: 7 case(s) compared: 1 regression" in " ".join(done.stdout.split())


def test_a_slowdown_within_the_tolerance_passes(tmp_path):
    done = gate("--results", slowed(tmp_path, "page_topk", "decode", factor=1.05), "--baseline", BASE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_failure_measured_under_contention_is_inconclusive_and_passes(tmp_path):
    run = slowed(tmp_path, "page_topk", "decode", trust="busy;contended")
    done = gate("--results", run, "--baseline", BASE)
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert "inconclusive: passed with a warning: the failing cases were measured under contention" in text
    assert "Page top-k" in text.split("inconclusive: passed")[1]


def test_a_cpu_kind_without_a_baseline_passes_with_one_line_and_the_command_that_adds_it(tmp_path):
    done = gate("--kind", "avx2-none-such", "--results", RUN)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == (
        "time gate: no baseline for CPU kind avx2-none-such (baselines/ci-time-avx2-none-such.csv): passed "
        "without judging; add one on a machine of this kind: python scripts/time_gate.py --write-baseline\n"
    )


def test_memory_is_not_this_gates_business_but_a_lost_case_is(tmp_path):
    frame = pd.read_csv(RUN, dtype=str, keep_default_na=False)
    frame["peak_bytes"] = "1"  # every peak smaller: the memory gate's concern, not this one's
    frame.to_csv(tmp_path / "peaks.csv", index=False)
    assert gate("--results", tmp_path / "peaks.csv", "--baseline", BASE).returncode == 0
    frame.iloc[1:].to_csv(tmp_path / "lost.csv", index=False)  # a case of the baseline missing
    done = gate("--results", tmp_path / "lost.csv", "--baseline", BASE)
    assert done.returncode == 1 and "missing from NEW" in done.stdout


def test_the_cpu_kind_names_the_instruction_set_and_the_bf16_flags():
    from topk_bench.measure.metadata import cpu_kind

    assert cpu_kind("AVX512", "avx512_bf16") == "avx512-avx512_bf16"
    assert cpu_kind("AVX512", "avx512_bf16;amx_bf16;amx_tile") == "avx512-avx512_bf16-amx_bf16-amx_tile"
    assert cpu_kind("AVX2", "none") == "avx2"
