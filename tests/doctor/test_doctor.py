"""``topk-bench doctor``: every check listed and passing on this machine; a wrong implementation fails it, by name."""

import os
import subprocess
import sys

import pytest
import torch

import topk_bench.attention
from locations import TESTS
from topk_bench.doctor import agreement, oom, tiny
from topk_bench.doctor.check import Result, brief
from topk_bench.plugins import load

PLUGINS = TESTS / "plugins"
WRONG = str(PLUGINS / "wrong_attention.py")

pytestmark = pytest.mark.usefixtures("single_thread")


def doctor(*args):
    return subprocess.run(
        [sys.executable, "-m", "topk_bench", "doctor", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
    )


def test_agreement_fails_a_wrong_implementation_and_says_by_how_much():
    load([WRONG])
    check = agreement.check("test_wrong", "cpu")
    assert check.result == Result.FAIL and check.name == "agreement: test_wrong"
    assert "vs vanilla" in check.detail and "float64: max rel err" in check.detail


def test_a_reference_that_cannot_run_here_is_a_failed_check_not_a_crash(monkeypatch):
    """On the H100's Python 3.12, performer-pytorch failed to import (no distutils) inside Performer's own
    float64 reference: the doctor died with a traceback instead of reporting the one failed check."""
    from topk_bench.attention.methods import performer

    def missing():
        raise ModuleNotFoundError("No module named 'distutils'")

    monkeypatch.setattr(performer, "_package", missing)
    check = agreement.check("performer", "cpu")
    assert check.result == Result.FAIL and check.name == "agreement: performer"
    assert (
        "reference performer in float64 on cpu raised ModuleNotFoundError: No module named 'distutils'" in check.detail
    )


def test_agreement_makes_selection_methods_exact_and_compares_them_with_vanilla():
    # Covering every key makes top-k exact: compared with vanilla, at float64 roundoff.
    topk = agreement.check("topk", "cpu")
    assert topk.result == Result.PASS and "vs vanilla" in topk.detail
    # Performer has no exact configuration (random features): compared with itself in float64.
    assert agreement.reference_of(topk_bench.attention.spec("performer")) == "performer"


@pytest.mark.parametrize("name", ["topk", "topk_fast", "topk_sparse", "topk_paper"])
def test_a_top_k_method_is_also_judged_where_it_drops_keys(name):
    check = agreement.check(name, "cpu")
    assert check.result == Result.PASS, check.detail
    assert check.detail.startswith("every key kept, vs vanilla float64 on cpu; ")
    dropping = check.detail.split("; keys dropped (topk 3 of 10), attention alone vs a float64 top-k oracle on cpu: ")
    assert len(dropping) == 2 and "float64: max rel err" in dropping[1] and "float32: max rel err" in dropping[1]


def test_a_method_that_keeps_the_smallest_scores_fails_where_it_drops_keys():
    """Covering every key, it is exact: only the check where keys are dropped can fail it."""
    load([str(PLUGINS / "smallest_topk.py")])
    check = agreement.check("test_smallest_topk", "cpu")
    assert check.result == Result.FAIL
    covering, dropping = check.detail.split("; keys dropped (topk 3 of 10)")
    assert "float64: max rel err" in covering and ">" not in covering  # where it keeps every key, it agrees
    assert "float64: max rel err" in dropping and "> 1e-10" in dropping and "> 1e-05" in dropping


def test_the_top_k_oracle_is_top_k_attention(f64):
    """Against its definition spelled out query by query: the topk largest allowed scores, a softmax over them."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 6, 4, generator=generator) for _ in range(3))
    out = agreement.topk_oracle(q, k, v, topk=2, causal=True)
    for i in range(6):
        scores = q[0, 0, i] @ k[0, 0, : i + 1].T
        kept = scores.argsort(descending=True)[:2]
        expected = scores[kept].softmax(0) @ v[0, 0, kept]
        assert torch.allclose(out[0, 0, i], expected, rtol=1e-12, atol=0)
    # Keeping every key, it is softmax attention.
    full = agreement.topk_oracle(q, k, v, topk=6, causal=False)
    assert torch.allclose(full, (q @ k.transpose(-2, -1)).softmax(-1) @ v, rtol=1e-12, atol=0)


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
    for name in (
        "agreement: vanilla",
        "agreement: topk",
        "agreement: performer",
        "peak = predicted: qchunk",
        "oom: past the device",
        "oom: past the budget",
        "TF32 off while measuring",
        "timer",
    ):
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
    # Predicted as measured: the workspaces in the peak and apart (--predict --device cuda).
    predicted = Measurement(
        status="ok", peak_bytes=853_824_000 + workspace, baseline_bytes=15_740_928, extra={"workspace_bytes": workspace}
    )

    def measured(peak=predicted.peak_bytes, baseline=predicted.baseline_bytes, **extra):
        return Measurement(
            status="ok",
            peak_bytes=peak,
            baseline_bytes=baseline,
            reserved_bytes=peak + 2**21,
            extra={"workspace_bytes": workspace, **extra},
        )

    def judged(m):
        monkeypatch.setattr(peaks, "_pair", lambda name, device, plugins, dtype: (m, predicted))
        return peaks.check("vanilla", "cuda")

    ok = judged(measured())
    assert ok.result == Result.PASS and "workspace 68,157,440 B" in ok.detail, ok
    # Within the CUDA prediction's stated accuracy (1 MiB above the baseline) passes; past it fails.
    assert judged(measured(peak=predicted.peak_bytes + 2**20)).result == Result.PASS
    assert judged(measured(peak=predicted.peak_bytes - 2**20)).result == Result.PASS
    late = judged(measured(peak=predicted.peak_bytes + 2**20 + 512))
    assert late.result == Result.FAIL and "tolerance 1 MiB" in late.detail
    # The old meaning (the workspace in the baseline) no longer passes: one baseline on every backend.
    assert judged(measured(baseline=predicted.baseline_bytes + workspace)).result == Result.FAIL


def test_the_flex_probe_has_heads_of_16_at_least():
    """The CUDA FlexAttention compiler refuses head_dim 8 (BackendCompilerFailed): the doctor's shape is 16."""
    for device in ("cpu", "cuda"):
        params = tiny.case("flex", device=device).param_dict
        assert params["d_model"] // params["heads"] >= 16


def _refused(q, k, v, *, causal=False, activation="softmax"):
    from torch._dynamo.exc import BackendCompilerFailed

    raise BackendCompilerFailed(lambda *a: None, RuntimeError("NYI: head_dim 8 < 16 for flex attention"), None)


def test_a_compile_failure_is_skipped_with_its_reason():
    topk_bench.attention.register(
        topk_bench.attention.Implementation("compiles_badly", _refused, "raises BackendCompilerFailed")
    )
    check = agreement.check("compiles_badly", "cpu")
    assert check.result == Result.SKIPPED, check
    assert "compile failed: BackendCompilerFailed" in check.detail and "head_dim 8 < 16" in check.detail
    # Anything else an implementation raises stays a failure.
    load([WRONG])
    assert agreement.check("test_wrong", "cpu").result == Result.FAIL


def test_a_case_that_failed_to_compile_in_its_child_is_a_skipped_peak_check(monkeypatch):
    from topk_bench.case import Budget, Measurement
    from topk_bench.child.execute import classify
    from topk_bench.doctor import peaks

    try:
        _refused(None, None, None)
    except Exception as exc:  # noqa: BLE001
        status, error = classify(exc, Budget())
    assert status == "error" and "NYI: head_dim 8 < 16" in error  # the reason, not only "backend raised:"
    failed = Measurement(status=status, error=error)
    monkeypatch.setattr(peaks, "_pair", lambda name, device, plugins, dtype: (failed, Measurement(status="ok")))
    check = peaks.check("vanilla", "cuda")
    assert check.result == Result.SKIPPED and "NYI: head_dim 8 < 16" in check.detail
    crashed = Measurement(status="error", error="RuntimeError: CUDA error: an illegal memory access")
    monkeypatch.setattr(peaks, "_pair", lambda name, device, plugins, dtype: (crashed, Measurement(status="ok")))
    assert peaks.check("vanilla", "cuda").result == Result.FAIL


def test_the_cuda_peak_check_takes_reserved_bytes_within_5_percent(monkeypatch):
    from topk_bench.case import Measurement
    from topk_bench.doctor import peaks

    workspace = 68_157_440
    # As --predict --device cuda gives them: the workspaces in the peak and the reserved bytes, and apart.
    predicted = Measurement(
        status="ok",
        peak_bytes=10_000_000 + workspace,
        baseline_bytes=1_000_000,
        reserved_bytes=20 * 2**20 + workspace,
        extra={"workspace_bytes": workspace},
    )

    def judged(reserved):
        measured = Measurement(
            status="ok",
            peak_bytes=10_000_000 + workspace,
            baseline_bytes=1_000_000,
            reserved_bytes=reserved,
            extra={"workspace_bytes": workspace},
        )
        monkeypatch.setattr(peaks, "_pair", lambda name, device, plugins, dtype: (measured, predicted))
        return peaks.check("vanilla", "cuda")

    exact = 20 * 2**20 + workspace
    assert judged(exact).result == Result.PASS
    assert judged(int(exact * 1.049)).result == Result.PASS
    assert judged(int(exact * 1.06)).result == Result.FAIL and "tolerance 5%" in judged(int(exact * 1.06)).detail


def test_the_compiled_kernels_agree_with_torch_and_a_wrong_kernel_fails_the_check(monkeypatch):
    from topk_bench.attention.kernels import native
    from topk_bench.doctor import native as native_check

    if not native.status().built:
        (kernels, path) = native_check.checks("cpu")
        assert kernels.result == Result.SKIPPED and native.status().reason in kernels.detail
        pytest.skip(f"no compiled kernels here: {native.status().reason}")
    kernels, path = native_check.checks("cpu")
    assert kernels.result == Result.PASS and f"built {native.status().key}" in kernels.detail
    assert path.name == "code path (topk_fast)" and f"native_kernels=built:{native.status().key}" in path.detail
    assert "torch.float32" not in path.detail and path.detail.startswith("float32: ")

    real = native.row_topk_

    def off_by_one(scores, k, values, indices):  # the k-th value of each row replaced by the (k+1)-th
        real(scores, k, values, indices)
        values[..., 0] = torch.topk(scores, k + 1, dim=-1).values[..., -1] if k < scores.shape[-1] else values[..., 0]

    monkeypatch.setattr(native, "row_topk_", off_by_one)
    (kernels, _) = native_check.checks("cpu")
    assert kernels.result == Result.FAIL and "row_topk_ torch.float32 k=1: values differ from torch.topk's" in (
        kernels.detail
    )


def test_a_run_without_the_kernels_is_a_skipped_check_that_says_why():
    done = subprocess.run(
        [sys.executable, "-c", "from topk_bench.doctor import native; print(*native.checks('cpu'), sep='\\n')"],
        capture_output=True, text=True, env={**os.environ, "TOPK_BENCH_NATIVE": "0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not used here: disabled by TOPK_BENCH_NATIVE=0; topk_fast runs torch's" in done.stdout
    assert "native_kernels=torch:disabled by TOPK_BENCH_NATIVE=0" in done.stdout
