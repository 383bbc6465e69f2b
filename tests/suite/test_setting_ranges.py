"""Flags get the validation of the suite's and bench.toml's keys: one line naming the flag or the file,
nothing written; the largest time budget allowed runs a real case."""

from __future__ import annotations

import pytest

from faults import tiny_suite

# --- flags get the same validation as suite keys -------------------------------------------------------


@pytest.mark.parametrize(
    "flag,value,words",
    [
        ("--max-memory", "nan", "finite"),
        ("--max-memory", "inf", "finite"),
        ("--max-case-seconds", "inf", "finite"),
        ("--max-case-seconds", "nan", "finite"),
        ("--max-case-seconds", "1e10", "less than or equal to"),
        ("--jobs", "100000", "less than or equal to"),
        ("--warmup-s", "inf", "finite"),
    ],
)
def test_a_flag_out_of_range_is_one_line_and_writes_nothing(tmp_path, cli, flag, value, words):
    suite = tiny_suite(tmp_path)
    result = cli("run", suite, "--out", tmp_path / "out", flag, value)
    line = result.error_line
    assert result.code == 2 and line.startswith(f"topk-bench: error: {flag}: ") and words in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["suite", "bench.toml"])
@pytest.mark.parametrize(
    "key,value,words",
    [
        ("max_memory_gib", "inf", "finite"),
        ("max_memory_gib", "nan", "finite"),
        ("max_case_seconds", "inf", "finite"),
        ("max_case_seconds", "1e10", "less than or equal to"),
        ("warmup_s", "inf", "finite"),
        ("warmup_s", "-1", "greater than or equal to 0"),
    ],
)
def test_a_setting_out_of_range_is_one_line_naming_its_file(tmp_path, cli, where, key, value, words):
    config = tmp_path / "bench.toml"
    suite = tiny_suite(tmp_path, extra=f"{key} = {value}" if where == "suite" else "")
    config.write_text(f"{key} = {value}\n" if where == "bench.toml" else "")
    result = cli("run", suite, "--out", tmp_path / "out", "--config", config)
    line = result.error_line
    named = suite if where == "suite" else config
    assert result.code == 2 and f"{named}: {key}: " in line and words in line, line
    assert not (tmp_path / "out").exists()


def test_the_largest_time_budget_allowed_runs_a_real_case(tmp_path):
    """The bound is where the launcher's wait still works: a case under it is measured, not an error row."""
    from topk_bench.case import Budget, Case
    from topk_bench.run.launcher import run_isolated
    from topk_bench.suite.values import MAX_CASE_SECONDS

    case = Case.make(
        suite="t",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        mode="fwd",
        warmup=0,
        repeats=1,
    )
    result = run_isolated(case, Budget(max_seconds=MAX_CASE_SECONDS))
    assert result.status == "ok", result.error
