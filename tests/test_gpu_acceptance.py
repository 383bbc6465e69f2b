"""scripts/gpu_acceptance.sh's CPU-side parts: its reports (scripts/gpu_report.py), its phases, and its fork
check in a dry run on the CPU (ALLOW_CPU=1), passing, and failing when a case starts a fresh interpreter."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_report  # noqa: E402

MIB = 2**20


def write(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def row(impl: str, method: str, peak: int, baseline: int, reserved: int | None, **extra) -> dict:
    return {"suite": "ci", "case_id": f"{impl}-{method}", "workload": "mha", "impl": impl, "label": impl,
            "mode": "fwd_bwd", "device": "cuda", "method": method, "status": "ok", "peak_bytes": peak,
            "baseline_bytes": baseline, "reserved_bytes": "" if reserved is None else reserved, "seq_len": 2048,
            "timestamp": method, **extra}


def test_gaps_take_the_workspace_out_and_hold_the_stated_accuracy(tmp_path, capsys):
    workspace = 65 * MIB
    predicted = write(tmp_path / "p.csv", [row("vanilla", "predicted", 900 * MIB, 16 * MIB, 1000 * MIB),
                                           row("sdpa", "predicted", 100 * MIB, 16 * MIB, 120 * MIB)])

    def measured(off_vanilla: int, reserved_sdpa: float) -> Path:
        return write(tmp_path / "m.csv", [
            row("vanilla", "measured", 900 * MIB + workspace + off_vanilla, 16 * MIB, 1000 * MIB + workspace,
                workspace_bytes=workspace),
            row("sdpa", "measured", 100 * MIB + workspace, 16 * MIB, int(reserved_sdpa), workspace_bytes=workspace)])

    assert gpu_report.gaps(str(measured(MIB, (120 * MIB + workspace) * 1.04)), str(predicted)) == 0
    assert gpu_report.gaps(str(measured(MIB + 512, (120 * MIB + workspace))), str(predicted)) == 1
    assert "above baseline off    +1.000 MiB" in capsys.readouterr().out
    assert gpu_report.gaps(str(measured(0, (120 * MIB + workspace) * 1.06)), str(predicted)) == 1
    # Nothing compared is no pass.
    assert gpu_report.gaps(str(measured(0, 0)), str(write(tmp_path / "none.csv", [row("topk", "predicted", 1, 1, 1)]))) == 1


def test_the_committed_h100_rows_show_the_gaps_the_issue_names(capsys):
    """tests/data/h100-ci.csv against the committed prediction: 11 of the 17 common cases off (issue 26)."""
    assert gpu_report.gaps(str(ROOT / "tests/data/h100-ci.csv"), str(ROOT / "results/baselines/ci-predicted.csv")) == 1
    out = capsys.readouterr().out
    assert "17 cases compared, 11 off" in out and "mha/Vanilla seq_len=2048" in out and "+193.005 MiB" in out


def test_times_are_put_against_the_fastest_dense_case(tmp_path, capsys):
    rows = [row(impl, "measured", 1, 1, None, kv_len=131072, budget=8192, timer="cudagraph", time_median_s=t,
                times_s=f"{t};{t}", ops_per_iter=ops)
            for impl, t, ops in (("vanilla", 0.004, 31), ("sdpa", 0.002, 10), ("page_topk", 0.001, 134))]
    assert gpu_report.times(str(write(tmp_path / "kv.csv", rows))) == 0
    out = capsys.readouterr().out
    assert "0.500x dense" in out and "1.000x dense" in out and "ops   134" in out


def acceptance(tmp_path: Path, **env) -> tuple[int, str]:
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(ROOT / "scripts/gpu_acceptance.sh")], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHON": sys.executable, "OUT": str(out), **env}, timeout=600)
    summary = next(out.glob("summary-*.txt"), None)
    return result.returncode, summary.read_text() if summary else result.stdout + result.stderr


def test_a_phase_that_does_not_exist_is_refused(tmp_path):
    code, text = acceptance(tmp_path, PHASE="4")
    assert code == 2 and "PHASE must be 1, 2 or 3" in text


@pytest.mark.slow  # a template and its children (a tiny suite measured on the CPU)
def test_the_fork_check_passes_here_and_fails_when_a_case_starts_a_fresh_interpreter(tmp_path):
    code, summary = acceptance(tmp_path, ALLOW_CPU="1", STEPS="install forks")
    assert code == 0, summary
    assert "PASS  forks: every case's child forked from the warm template" in summary
    assert (tmp_path / "out/gpu_check-1.tar.gz").is_file()
    # Each case a fresh interpreter (as the last H100 run had it): the check says so.
    code, summary = acceptance(tmp_path, ALLOW_CPU="1", STEPS="install forks", TOPK_BENCH_FRESH_INTERPRETER="1")
    assert code == 1 and "FAIL  forks: the template did not fork in this build" in summary
