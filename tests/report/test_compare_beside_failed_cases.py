"""`compare` with failed cases on either side: it fails on nothing comparable and judges the cases that
compare beside a failure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest


def _rewritten(csv_path: Path, target: Path, **columns) -> Path:
    """A copy of the results CSV with every row's ``columns`` set (a value, or a list: one per row)."""
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    for column, value in columns.items():
        frame[column] = value
    target.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(target, index=False)
    return target


# --- compare never passes on nothing comparable --------------------------------------------------------

FAILED = {
    "peak_bytes": "",
    "baseline_bytes": "",
    "times_s": "",
    "time_median_s": "",
    "time_iqr_s": "",
    "time_mean_s": "",
    "time_min_s": "",
    "repeats": "0",
    "trust": "",
    "time_cv": "",
}


@pytest.mark.parametrize(
    "base_status,new_status", [("error", "error"), ("error", "crashed"), ("unsupported", "skipped")]
)
def test_compare_fails_when_every_case_failed_on_a_side(measured_csv, cli, tmp_path, base_status, new_status):
    base = _rewritten(measured_csv, tmp_path / "base" / "tiny.csv", status=base_status, **FAILED)
    new = _rewritten(measured_csv, tmp_path / "new" / "tiny.csv", status=new_status, **FAILED)
    result = cli("compare", base.parent, new.parent)
    assert result.code == 1, result.out
    assert "nothing compared" in result.out and "no regression" not in result.out, result.out


def test_compare_fails_when_new_ok_rows_have_no_peak_and_no_samples(measured_csv, cli, tmp_path):
    new = _rewritten(measured_csv, tmp_path / "new" / "tiny.csv", **{k: v for k, v in FAILED.items() if k != "repeats"})
    result = cli("compare", measured_csv, new)
    assert result.code == 1, result.out
    assert "invalid" in result.out and "no regression" not in result.out, result.out
    assert "peak_bytes" in result.out and "NEW has none" in result.out, result.out


def test_compare_judges_the_cases_that_compare_beside_a_failure_that_changed_kind(measured_csv, cli, tmp_path):
    """One case went from error to crashed while the others were measured on both sides: the gate judges the
    others (the rule above is about nothing comparable, not about any failed case)."""
    base = _rewritten(measured_csv, tmp_path / "base.csv", status=["error", "ok", "ok"])
    new = _rewritten(measured_csv, tmp_path / "new.csv", status=["crashed", "ok", "ok"])
    result = cli("compare", base, new)
    assert result.code == 0 and "error → crashed" in result.out, result.out
