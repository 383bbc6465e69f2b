"""`compare` as a gate: nothing valid, missing cases, non-finite or negative numbers and ties never
pass silently."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from topk_bench.report.stats import Verdict, classify_ratio, classify_samples


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def write_lines(path: Path, text_lines: list[str]) -> None:
    path.write_text("\n".join(text_lines) + "\n")


# --- 4. gates that pass on nothing -------------------------------------------------------------------


def test_compare_fails_when_new_has_no_valid_rows(measured, cli, tmp_path):
    suite, out, csv_path = measured
    header_only = tmp_path / "header_only.csv"
    header_only.write_text(lines(csv_path)[0] + "\n")
    unknown_status = tmp_path / "unknown_status.csv"
    write_lines(unknown_status, [line.replace(",ok,", ",OK,") for line in lines(csv_path)])
    for new in (header_only, unknown_status):
        result = cli("compare", csv_path, new)
        assert result.code == 1, result.out
        assert "nothing compared" in result.out and "no regression" not in result.out
    assert "unknown status 'OK'" in cli("compare", csv_path, unknown_status).out


def test_compare_fails_when_cases_went_missing_unless_allowed(measured, cli, tmp_path):
    suite, out, csv_path = measured
    fewer = tmp_path / "fewer.csv"
    write_lines(fewer, lines(csv_path)[:-1])
    result = cli("compare", csv_path, fewer)
    assert result.code == 1 and "1 case(s) of BASE missing from NEW" in result.out, result.out
    allowed = cli("compare", csv_path, fewer, "--allow-missing")
    assert allowed.code == 0 and "no regression" in allowed.out, allowed.out


# --- 5. NaN and negative numbers ---------------------------------------------------------------------


def _with(frame_path: Path, out_path: Path, **cells) -> Path:
    frame = pd.read_csv(frame_path, dtype=str, keep_default_na=False)
    for column, value in cells.items():
        frame.loc[0, column] = value
    frame.to_csv(out_path, index=False)
    return out_path


@pytest.mark.parametrize(
    "cells,why",
    [
        ({"times_s": "nan"}, "times_s"),
        ({"times_s": "0.1;inf"}, "times_s"),
        ({"peak_bytes": "nan"}, "peak_bytes"),
        ({"peak_bytes": "-1000"}, "peak_bytes"),
        ({"time_median_s": "-0.5"}, "time_median_s"),
    ],
)
def test_non_finite_or_negative_numbers_fail_compare_in_both_directions(measured, cli, tmp_path, cells, why):
    suite, out, csv_path = measured
    bad = _with(csv_path, tmp_path / "bad.csv", **cells)
    for base, new in ((csv_path, bad), (bad, csv_path)):
        result = cli("compare", base, new)
        assert result.code == 1, result.out
        assert "bad.csv line 2" in result.out and why in result.out, result.out
        assert "no regression" not in result.out


def test_statistics_refuse_non_finite_and_negative_inputs():
    nan, inf, good = float("nan"), float("inf"), [0.01] * 7
    for base, new in (([nan] * 7, good), (good, [nan] * 7), ([0.01, -0.02] * 4, good), (good, [inf] * 7)):
        result = classify_samples("time_s", base, new, 1.1, 0.002)
        assert result.verdict is Verdict.INVALID, result
    for base, new in ((nan, 1.0), (1.0, nan), (1000.0, -1.0), (-5.0, 5.0), (inf, 1.0)):
        assert classify_ratio("peak_bytes", base, new, 1.001).verdict is Verdict.INVALID


# --- 6. ties -----------------------------------------------------------------------------------------


def test_fully_separated_samples_with_ties_are_a_regression():
    base = [0.010, 0.010, 0.011, 0.011, 0.012, 0.012, 0.013]
    new = [10 * t for t in base]
    result = classify_samples("time_s", base, new, 1.1, 0.002)
    assert result.verdict is Verdict.REGRESSION, result
    assert result.p_value == pytest.approx(2 / 3432)  # the exact p: one arrangement of C(14, 7) on each side


def test_ties_that_keep_the_test_from_reaching_alpha_are_inconclusive_not_unchanged():
    # 10 samples share one value: no arrangement of these 14 values gives p < 0.07.
    base, new = [0.01] * 7, [0.01] * 3 + [0.1] * 4
    result = classify_samples("time_s", base, new, 1.1, 0.002)
    assert result.verdict is Verdict.INCONCLUSIVE, result
    assert result.min_p_value == pytest.approx(2 * 120 / 3432) and "ties" in result.note


def test_nonfinite_in_new_is_a_regression(measured, cli, tmp_path):
    suite, out, csv_path = measured
    new = tmp_path / "new.csv"
    write_lines(new, [lines(csv_path)[0]] + [line.replace(",ok,", ",nonfinite,") for line in lines(csv_path)[1:]])
    result = cli("compare", csv_path, new)
    assert result.code == 1 and "ok → nonfinite" in result.out
