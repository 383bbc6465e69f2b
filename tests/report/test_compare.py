"""``topk-bench compare``: the must-show variants of a real run, plus the rules and inputs on constructed rows."""

import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from locations import TESTS
from topk_bench.cli import main
from topk_bench.report.compare import Thresholds, compare_frames, load
from topk_bench.report.stats import Verdict, min_samples_for
from topk_bench.results.columns import REQUIRED_COLUMNS
from topk_bench.results.frame import load_results


def run_compare(*args):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", *map(str, args)])
    return exit_info.value.code


def scale_times(frame, factor, rows=None):
    out = frame.copy()
    for i in out.index if rows is None else rows:
        if isinstance(out.at[i, "times_s"], str):
            out.at[i, "times_s"] = ";".join(repr(float(t) * factor) for t in out.at[i, "times_s"].split(";"))
            out.at[i, "time_median_s"] = out.at[i, "time_median_s"] * factor
    return out


# --- must show: controlled variants of a real run -------------------------------------------------

REAL_RUN = TESTS / "data" / "compare_run.csv"


@pytest.fixture
def real_run():
    """A measured CPU run by the real runner (tests/data/compare_run.toml says how to regenerate it)."""
    return REAL_RUN


@pytest.fixture
def variant(real_run, tmp_path):
    """Write a modified copy of the real run and compare it against the original: returns (exit code, stdout)."""
    base = load_results(real_run)

    def compare_with(change, capsys):
        new_path = tmp_path / "new.csv"
        change(base.copy()).to_csv(new_path, index=False)
        code = run_compare(real_run, new_path)
        return code, capsys.readouterr().out

    return base, compare_with


def test_real_run_is_timed_enough_for_the_test(real_run):
    frame = load_results(real_run)
    ok = frame[(frame.status == "ok") & (frame.method == "measured")]
    assert len(ok) == len(frame) >= 2
    assert all(len(t.split(";")) >= min_samples_for(0.002) for t in ok.times_s)


def test_unchanged_exits_0(variant, capsys):
    _, compare_with = variant
    code, out = compare_with(lambda f: f, capsys)
    assert code == 0, out
    assert "no regression" in out


def test_all_times_x3_exits_1(variant, capsys):
    base, compare_with = variant
    code, out = compare_with(lambda f: scale_times(f, 3.0), capsys)
    assert code == 1, out
    assert f"{len(base)} regression" in out and "(×3.000)" in out


def test_times_x1_02_exits_0(variant, capsys):
    base, compare_with = variant
    code, out = compare_with(lambda f: scale_times(f, 1.02), capsys)
    assert code == 0, out
    assert f"{len(base)} unchanged" in out


def test_one_peak_x1_10_exits_1(variant, capsys):
    base, compare_with = variant
    first_ok = base.index[base.status == "ok"][0]

    def bigger(f):
        f["peak_bytes"] = f["peak_bytes"].astype(float)
        f.at[first_ok, "peak_bytes"] *= 1.10
        return f

    code, out = compare_with(bigger, capsys)
    assert code == 1, out
    assert "1 regression" in out and "(×1.100)" in out


def test_one_case_ok_to_oom_exits_1(variant, capsys):
    base, compare_with = variant
    first_ok = base.index[base.status == "ok"][0]

    def oom(f):
        f.at[first_ok, "status"] = "oom"
        return f

    code, out = compare_with(oom, capsys)
    assert code == 1, out
    assert "ok → oom" in out


def test_faster_exits_0_and_is_reported_as_improvement(variant, capsys):
    base, compare_with = variant
    code, out = compare_with(lambda f: scale_times(f, 1 / 3), capsys)
    assert code == 0, out
    assert f"{len(base)} improvement" in out and "0 regression" in out


# --- rules and inputs on constructed rows ---------------------------------------------------------


def make_row(case_id, *, device="cpu", status="ok", peak=1_000_000, reserved=None, times=(0.01,) * 7, **extra):
    row = dict.fromkeys(REQUIRED_COLUMNS, "")
    row.update(
        suite="t",
        case_id=case_id,
        workload="mha",
        impl="vanilla",
        label="vanilla",
        mode="fwd_bwd",
        device=device,
        method="measured",
        status=status,
        peak_bytes=peak,
        reserved_bytes=reserved,
        time_median_s=sorted(times)[len(times) // 2] if times else None,
        times_s=";".join(map(str, times)),
        seq_len=256,
        **extra,
    )
    return row


def frame(*rows):
    return pd.DataFrame(list(rows)).set_index("case_id", drop=False)


def test_reserved_bytes_has_its_own_looser_factor_where_both_sides_have_it():
    base = frame(make_row("a", device="cuda", reserved=2**30), make_row("b"))
    slightly = frame(make_row("a", device="cuda", reserved=2**30 * 1.03), make_row("b"))
    assert not compare_frames(base, slightly).has_regression  # within 1.05
    assert compare_frames(base, slightly).cases[1].metric("reserved_bytes") is None  # the CPU has none
    much = frame(make_row("a", device="cuda", reserved=2**30 * 1.10), make_row("b"))
    result = compare_frames(base, much)
    assert result.has_regression
    assert result.cases[0].metric("reserved_bytes").verdict is Verdict.REGRESSION
    # Allocated and reserved are both gated: an allocated regression alone fails too.
    allocated = frame(make_row("a", device="cuda", peak=1_100_000, reserved=2**30), make_row("b"))
    assert compare_frames(base, allocated).cases[0].metric("peak_bytes").verdict is Verdict.REGRESSION


def test_status_changes_between_failures_are_not_regressions_and_fixes_are_improvements():
    base = frame(make_row("a", status="oom"), make_row("b", status="timeout"))
    new = frame(make_row("a", status="timeout"), make_row("b"))
    result = compare_frames(base, new)
    assert not result.has_regression
    assert [c.verdict for c in result.cases] == [Verdict.UNCHANGED, Verdict.IMPROVEMENT]


def test_new_cases_are_listed_and_missing_ones_fail_unless_allowed():
    base, new = frame(make_row("a"), make_row("gone")), frame(make_row("a"), make_row("added"))
    result = compare_frames(base, new)
    assert [cid for cid, _ in result.only_new] == ["added"]
    assert [cid for cid, _ in result.only_base] == ["gone"]
    assert result.exit_code == 1 and result.failures == [
        "1 case(s) of BASE missing from NEW (--allow-missing if the suite lost them on purpose)"
    ]
    assert compare_frames(base, new, allow_missing=True).exit_code == 0
    assert compare_frames(frame(make_row("a")), new).exit_code == 0  # a new case alone passes


def test_few_samples_beyond_the_factor_are_inconclusive_not_regressions():
    result = compare_frames(
        frame(make_row("a", times=(0.01, 0.011, 0.012))), frame(make_row("a", times=(0.05, 0.051, 0.052)))
    )
    assert result.cases[0].verdict is Verdict.INCONCLUSIVE
    assert result.exit_code == 0


def test_thresholds_are_options(tmp_path, capsys):
    pd.DataFrame([make_row("a")]).to_csv(tmp_path / "base.csv", index=False)
    pd.DataFrame([make_row("a", peak=1_050_000)]).to_csv(tmp_path / "new.csv", index=False)
    assert run_compare(tmp_path / "base.csv", tmp_path / "new.csv") == 1
    assert run_compare(tmp_path / "base.csv", tmp_path / "new.csv", "--memory-factor", "1.06") == 0


def test_directories_markdown_and_benchmark_json(tmp_path, capsys):
    for side, peak in (("base", 1_000_000), ("new", 2_000_000)):
        (tmp_path / side).mkdir()
        pd.DataFrame([make_row("a", peak=peak)]).to_csv(tmp_path / side / "one.csv", index=False)
        pd.DataFrame([make_row("b")]).to_csv(tmp_path / side / "two.csv", index=False)
    code = run_compare(
        tmp_path / "base", tmp_path / "new", "--markdown", tmp_path / "r.md", "--json", tmp_path / "r.json"
    )
    assert code == 1
    text = (tmp_path / "r.md").read_text()
    assert "❌ **Regression**" in text and "| case |" in text and "(×2.000)" in text
    entries = json.loads((tmp_path / "r.json").read_text())
    assert {e["unit"] for e in entries} == {"bytes", "s"}
    assert all(set(e) <= {"name", "unit", "value", "range", "extra"} for e in entries)
    assert all(isinstance(e["value"], float) for e in entries)
    assert len({e["name"] for e in entries}) == len(entries) == 4


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    good = tmp_path / "good.csv"
    pd.DataFrame([make_row("a")]).to_csv(good, index=False)
    no_columns = tmp_path / "no_columns.csv"
    no_columns.write_text("case_id,impl\nx,vanilla\n")
    bad_times = tmp_path / "bad_times.csv"
    pd.DataFrame([make_row("a", times=())]).assign(times_s="fast").to_csv(bad_times, index=False)
    other = tmp_path / "other.csv"
    pd.DataFrame([make_row("z")]).to_csv(other, index=False)
    cases = [
        ((tmp_path / "missing.csv", good), "missing.csv: no such file"),
        ((no_columns, good), "no_columns.csv: not a topk-bench results file: no column 'suite'"),
        ((good, other), "no case_id in common"),
        ((good, good, "--alpha", "0"), "--alpha"),
    ]
    for args, message in cases:
        assert run_compare(*args) == 2, args
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], err
    # A row whose samples are not numbers is left out by the reader: the gate fails (1) and says which line.
    assert run_compare(good, bad_times) == 1
    assert "NEW left out bad_times.csv line 2: times_s: expected a number, got 'fast'" in capsys.readouterr().out


@pytest.mark.slow
def test_bad_input_from_the_console_is_one_line_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "topk_bench", "compare", str(tmp_path / "nope.csv"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"topk-bench: error: {tmp_path / 'nope.csv'}: no such file or directory"


def test_duplicate_case_ids_keep_the_last_row(tmp_path):
    path = tmp_path / "r.csv"
    pd.DataFrame([make_row("a", status="crashed"), make_row("a")]).to_csv(path, index=False)
    assert load(path).loc["a", "status"] == "ok"


def test_invalid_factor_is_bad_input():
    from topk_bench.errors import BadInput

    with pytest.raises(BadInput, match="--time-factor"):
        Thresholds(time_factor=0.9).validate()


def test_runs_from_different_devices_are_warned_about():
    base = frame(make_row("a", device_name="NVIDIA A100"))
    new = frame(make_row("a", device_name="NVIDIA H100"))
    (warning,) = compare_frames(base, new).warnings
    assert "device_name NVIDIA A100 vs NVIDIA H100" in warning
    assert not compare_frames(base, base).warnings


def test_runs_on_different_hardware_or_software_get_one_warning_line():
    """The CPU pool mixes AVX2-only and AVX-512-BF16 machines of one name: the instruction set tells them apart."""
    same = dict(device_name="AMD EPYC", torch_version="2.13.0")
    base = frame(
        make_row("a", cpu_capability="AVX2", cpu_flags="none", **same),
        make_row("b", cpu_capability="AVX2", cpu_flags="none", **same),
    )
    new = frame(
        make_row("a", cpu_capability="AVX512", cpu_flags="avx512_bf16", cuda_version="13.0", **same),
        make_row("b", cpu_capability="AVX512", cpu_flags="avx512_bf16", cuda_version="13.0", **same),
    )
    (warning,) = compare_frames(base, new).warnings
    assert "\n" not in warning and warning.startswith("BASE and NEW ran on different hardware or software")
    assert "cpu_capability AVX2 vs AVX512" in warning and "cpu_flags none vs avx512_bf16" in warning
    assert "device_name" not in warning and "cuda_version" not in warning  # the same, or BASE does not say

    # Software is judged on every row, hardware on measured rows only (a prediction depends on no hardware).
    def predicted(**changes):
        return frame({**make_row("a", cpu_capability="AVX2", **same), "method": "predicted", **changes})

    assert not compare_frames(predicted(), predicted(cpu_capability="AVX512")).warnings
    (software,) = compare_frames(predicted(), predicted(torch_version="2.14.0")).warnings
    assert "torch_version 2.13.0 vs 2.14.0" in software


def _check_action_format(entries):
    """What github-action-benchmark's customSmallerIsBetter accepts (and what its charts need)."""
    assert isinstance(entries, list) and entries
    for e in entries:
        assert set(e) <= {"name", "unit", "value", "range", "extra"} and {"name", "unit", "value"} <= set(e)
        assert isinstance(e["name"], str) and isinstance(e["unit"], str)
        assert isinstance(e["value"], float) and math.isfinite(e["value"]) and e["value"] >= 0
        assert all(isinstance(e.get(k, ""), str) for k in ("range", "extra"))
    assert len({e["name"] for e in entries}) == len(entries)  # a name is a series


def test_benchmark_json_exports_allocated_reserved_and_time_and_failed_cases_as_such(tmp_path):
    from topk_bench.report.compare_render import FAILED_VALUE

    def side(reserved_b):
        return [
            make_row("a", device="cuda", reserved=2**20),
            make_row("b", device="cuda", reserved=reserved_b),
            make_row("c", device="cuda", reserved=2**20),
            make_row(
                "d", device="cuda", status="oom", peak=None, times=(), error="OutOfMemoryError: CUDA out of memory"
            ),
            make_row("e", peak=500),
        ]

    base, new = tmp_path / "base.csv", tmp_path / "new.csv"
    pd.DataFrame(side(2**20)).to_csv(base, index=False)
    rows = side(2**21)
    rows[2].update(status="over_budget", error="reserved peak 2 bytes exceeds the memory budget of 1 bytes")
    pd.DataFrame(rows).to_csv(new, index=False)
    assert run_compare(base, new, "--json", tmp_path / "r.json") == 1
    entries = json.loads((tmp_path / "r.json").read_text())
    _check_action_format(entries)
    by_name = {e["name"].rsplit(" ", 1)[1] + ":" + e["extra"].split("case_id=")[1][:1]: e for e in entries}
    # Every cuda case: allocated, reserved and time; the cpu one: allocated and time (no reserved).
    assert set(by_name) == (
        {f"{m}:{c}" for c in "abcd" for m in ("peak_bytes", "reserved_bytes", "time_s")} | {"peak_bytes:e", "time_s:e"}
    )
    assert (
        by_name["reserved_bytes:b"]["value"] == 2.0**21
        and "regression, ×2.000 vs base" in by_name["reserved_bytes:b"]["extra"]
    )
    assert by_name["peak_bytes:a"]["value"] == 1_000_000.0 and by_name["time_s:a"]["range"].startswith("± ")
    # Failed cases are points of their series: the sentinel, the status first in extra.
    for metric in ("peak_bytes", "reserved_bytes", "time_s"):
        assert by_name[f"{metric}:c"]["value"] == by_name[f"{metric}:d"]["value"] == FAILED_VALUE
    assert by_name["peak_bytes:c"]["extra"].startswith("status=over_budget; case_id=c; reserved peak")
    assert by_name["time_s:d"]["extra"] == "status=oom; case_id=d; OutOfMemoryError: CUDA out of memory"


def test_first_run_without_base_exports_new_and_says_so(tmp_path, capsys):
    new = tmp_path / "new.csv"
    pd.DataFrame([make_row("a"), make_row("b", status="timeout", peak=None, times=())]).to_csv(new, index=False)
    # Without the flag a missing BASE is bad input, as any missing file.
    assert run_compare(tmp_path / "baseline", new, "--json", tmp_path / "r.json") == 2
    assert not (tmp_path / "r.json").exists()
    capsys.readouterr()
    code = run_compare(
        tmp_path / "baseline", new, "--allow-no-base", "--json", tmp_path / "r.json", "--markdown", tmp_path / "r.md"
    )
    assert code == 0
    assert "first run, nothing to compare" in capsys.readouterr().out
    assert "First run, nothing to compare" in (tmp_path / "r.md").read_text()
    entries = json.loads((tmp_path / "r.json").read_text())
    _check_action_format(entries)
    assert [e["extra"].split(";")[0] for e in entries] == ["status=ok", "status=ok", "status=timeout", "status=timeout"]
    assert all("not in base" in e["extra"] for e in entries[:2])
    # A BASE that exists is compared as always, flag or not.
    assert run_compare(new, new, "--allow-no-base") == 0
    assert "no regression" in capsys.readouterr().out


def test_a_one_sample_suite_says_once_that_it_cannot_conclude(capsys):
    from topk_bench.report.compare_render import notes, print_rich

    base = frame(*(make_row(f"c{i}", times=(0.01,), d_model=2**i) for i in range(7)))
    new = frame(*(make_row(f"c{i}", times=(0.02,), d_model=2**i) for i in range(7)))
    result = compare_frames(base, new)
    assert {c.verdict for c in result.cases} == {Verdict.INCONCLUSIVE}
    assert len(notes(result)) == 1 and notes(result)[0].startswith("7 cases (")
    print_rich(result)
    assert capsys.readouterr().out.count("too few samples") == 1


def test_contended_times_are_one_warning_per_side():
    base = frame(make_row("a", trust="busy"), make_row("b", trust="noisy"), make_row("c", trust=""))
    new = frame(make_row("a", trust=""), make_row("b", trust=""), make_row("c", trust=""))
    warnings = compare_frames(base, new).warnings
    assert len(warnings) == 1 and warnings[0].startswith("BASE: 2 of 3 case(s) measured under contention")
    assert not compare_frames(new, new).warnings


def test_rows_of_one_case_from_different_code_get_one_warning_line_naming_the_cases():
    """One case_id, two programs: compiled kernels in BASE, torch's path in NEW (TOPK_BENCH_NATIVE=0)."""
    built, torch_path = "native_kernels=built:abc123", "native_kernels=torch:disabled by TOPK_BENCH_NATIVE=0"
    base = frame(*(make_row(c, code_path=built) for c in "abcde"), make_row("f", code_path=""))
    new = frame(*(make_row(c, code_path=torch_path) for c in "abcde"), make_row("f", code_path=""))
    (warning,) = compare_frames(base, new).warnings
    assert "\n" not in warning and warning.startswith("code_path differs in 5 case(s) (")
    assert "and 2 more" in warning and f"{built} vs {torch_path}" in warning
    assert not compare_frames(base, base).warnings
    # A side that does not say (a CSV from before the column) is not a difference.
    older = frame(*(make_row(c) for c in "abcdef")).drop(columns="code_path", errors="ignore")
    assert not compare_frames(older, new).warnings
