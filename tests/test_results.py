"""The results CSV: append (whole lines, fsynced), header widening, loading files and directories."""

from __future__ import annotations

import pytest

from topk_bench.case import Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.results import REQUIRED_COLUMNS, append_row, columns, load_results, make_row, read_rows


def row(n: int, **extra):
    case = Case.make(suite="s", workload="mha", impl="vanilla", params={"seq_len": n})
    m = Measurement(status="ok", peak_bytes=n, times_s=[0.5, 0.25, 1.0], extra=extra)
    return make_row(case, m, {"seq_len": n})


def test_row_statistics_from_raw_samples():
    r = row(8)
    assert r["times_s"] == "0.5;0.25;1.0" and r["time_median_s"] == 0.5 and r["time_min_s"] == 0.25
    assert r["repeats"] == 3 and r["status"] == "ok" and r["seq_len"] == 8
    assert set(REQUIRED_COLUMNS) <= set(r)


def test_append_and_load_round_trip(tmp_path):
    path = tmp_path / "s.csv"
    header = columns(["seq_len"])
    for n in (8, 16):
        append_row(path, row(n), header)
    frame = load_results(path)
    assert frame["seq_len"].tolist() == [8, 16] and frame["peak_bytes"].tolist() == [8, 16]
    assert all(isinstance(v, str) for v in frame["case_id"]) and frame["error"].tolist() == ["", ""]


def test_a_new_column_widens_the_header_and_keeps_rows(tmp_path):
    path = tmp_path / "s.csv"
    header = columns(["seq_len"])
    append_row(path, row(8), header)
    header = append_row(path, row(16, rel_err=0.1), header)
    assert header[-1] == "rel_err"
    rows = read_rows(path)
    assert [r["rel_err"] for r in rows] == ["", "0.1"] and [r["seq_len"] for r in rows] == ["8", "16"]


def test_a_line_cut_by_a_crash_is_ignored_and_does_not_swallow_the_next_row(tmp_path):
    path = tmp_path / "s.csv"
    header = columns(["seq_len"])
    append_row(path, row(8), header)
    with open(path, "a") as f:
        f.write("s,deadbeef,mha,vani")  # a writer killed mid-line (no newline)
    append_row(path, row(16), header)
    assert [r["seq_len"] for r in read_rows(path)] == ["8", "16"]
    assert load_results(path)["seq_len"].tolist() == [8, 16]


def test_load_a_directory_of_csvs(tmp_path):
    header = columns(["seq_len"])
    append_row(tmp_path / "a.csv", row(8), header)
    append_row(tmp_path / "b.csv", row(16), columns(["seq_len", "d_ff"]))
    frame = load_results(tmp_path)
    assert len(frame) == 2 and "d_ff" in frame.columns


@pytest.mark.parametrize("setup,words", [
    (lambda p: None, "no such file or directory"),
    (lambda p: p.mkdir(), "no results CSV"),
    (lambda p: p.write_text("a,b\n1,2\n"), "not a topk-bench results file"),
])
def test_load_bad_input(tmp_path, setup, words):
    path = tmp_path / "thing"
    setup(path)
    with pytest.raises(BadInput, match=words):
        load_results(path)
