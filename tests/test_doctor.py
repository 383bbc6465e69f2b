"""``topk-bench doctor``: every check listed and passing on this machine; a wrong implementation fails it, by name."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import implementations
from topk_bench.doctor import agreement, oom, tiny
from topk_bench.doctor.check import Result, brief
from topk_bench.plugins import load

PLUGINS = Path(__file__).parent / "plugins"
WRONG = str(PLUGINS / "wrong_attention.py")

pytestmark = pytest.mark.usefixtures("single_thread")


def doctor(*args):
    return subprocess.run([sys.executable, "-m", "topk_bench", "doctor", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "250"})


def test_agreement_fails_a_wrong_implementation_and_says_by_how_much():
    load([WRONG])
    check = agreement.check("test_wrong", "cpu")
    assert check.result == Result.FAIL and check.name == "agreement: test_wrong"
    assert "vs vanilla" in check.detail and "float64: max rel err" in check.detail


def test_agreement_makes_selection_methods_exact_and_compares_them_with_vanilla():
    # Covering every key makes top-k exact: compared with vanilla, at float64 roundoff.
    topk = agreement.check("topk", "cpu")
    assert topk.result == Result.PASS and "vs vanilla" in topk.detail
    # Performer has no exact configuration (random features): compared with itself in float64.
    assert agreement.reference_of(implementations.spec("performer")) == "performer"


def test_a_skipped_reason_is_whole_and_a_long_detail_is_cut_after_a_word():
    """flex has no backward on the CPU: its reason is given whole (it was cut to "(forward only: ru)")."""
    flex = agreement.check("flex", "cpu")
    assert flex.result == Result.SKIPPED and "(forward only: run under no_grad, or on CUDA)" in flex.detail
    assert brief("an error message that goes on\nsecond line", 100) == "an error message that goes on"
    assert brief("an error message that goes on", 20) == "an error message..."
    assert brief("x" * 30, 10) == "xxxxxxx..."


def test_relative_error_sees_a_missing_gradient_and_a_wrong_shape():
    a = torch.ones(3)
    assert agreement.relative_error(a, a) == 0.0
    assert agreement.relative_error(None, a) == float("inf")
    assert agreement.relative_error(torch.ones(2), a) == float("inf")
    assert agreement.relative_error(a * 1.5, a) == pytest.approx(0.5)


def test_the_doctors_cases_are_small_and_chunked():
    case = tiny.case("qchunk")
    assert case.param_dict["seq_len"] % case.option_dict["chunk_size"]  # a partial last chunk runs too
    assert case.option_dict["chunk_size"] < case.param_dict["seq_len"]


@pytest.mark.slow
def test_allocation_failures_in_a_child_get_the_statuses_run_records():
    checks = oom.checks("cpu")
    assert [c.result for c in checks] == [Result.PASS, Result.PASS], [c.detail for c in checks]
    assert "status oom" in checks[0].detail and "status over_budget" in checks[1].detail


@pytest.mark.slow
def test_doctor_on_this_machine_lists_every_check_and_exits_0():
    # Without CUDA, --device cuda runs the CPU checks and says so (not a failure).
    args = ("--device", "cuda") if not torch.cuda.is_available() else ()
    result = doctor(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for name in ("agreement: vanilla", "agreement: topk", "agreement: performer", "peak = predicted: qchunk",
                 "oom: past the device", "oom: past the budget", "TF32 off while measuring", "timer"):
        assert name in out
    assert "all " in out and " checks passed" in out
    if args:
        assert "CUDA is not available on this machine" in out


@pytest.mark.slow
def test_doctor_exits_1_naming_a_wrong_plugin_implementation():
    result = doctor("--plugins", WRONG)
    assert result.returncode == 1, result.stdout + result.stderr
    failed_line = [line for line in result.stdout.splitlines() if "checks failed" in line]
    assert failed_line and "agreement: test_wrong" in failed_line[0]
    assert "agreement: vanilla" in result.stdout  # the others still ran


def test_doctor_bad_device_or_plugin_is_one_line_exit_2(tmp_path):
    for args in (("--device", "tpu"), ("--plugins", str(tmp_path / "none.py"))):
        result = doctor(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1 and "topk-bench: error:" in result.stderr


def test_cuda_peak_check_takes_the_workspace_out_of_the_peak_and_matches_the_baseline(monkeypatch):
    """As measured on an H100 (CI suite, L=2048): baseline = parameters + inputs, the cuBLAS workspace
    (65 MiB) allocated by the warm-up and live through the timed iterations."""
    from topk_bench.case import Measurement
    from topk_bench.doctor import peaks

    workspace = 68_157_440
    predicted = Measurement(status="ok", peak_bytes=853_824_000, baseline_bytes=15_740_928)

    def measured(peak=predicted.peak_bytes + workspace, baseline=predicted.baseline_bytes, **extra):
        return Measurement(status="ok", peak_bytes=peak, baseline_bytes=baseline, reserved_bytes=peak + 2**21,
                           extra={"workspace_bytes": workspace, **extra})

    def judged(m):
        monkeypatch.setattr(peaks, "_pair", lambda name, device, plugins: (m, predicted))
        return peaks.check("vanilla", "cuda")

    ok = judged(measured())
    assert ok.result == Result.PASS and "workspace 68,157,440 B" in ok.detail, ok
    assert judged(measured(peak=predicted.peak_bytes + workspace + 512)).result == Result.FAIL
    # The old meaning (the workspace in the baseline) no longer passes: one baseline on every backend.
    assert judged(measured(baseline=predicted.baseline_bytes + workspace)).result == Result.FAIL
