"""The results CSV: append (whole lines, fsynced), header widening, loading files and directories."""

from __future__ import annotations

import pytest

from topk_bench.case import Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.results.columns import REQUIRED_COLUMNS
from topk_bench.results.columns import header as columns
from topk_bench.results.frame import load_results
from topk_bench.results.row import make_row
from topk_bench.results.store import append_row, read, read_rows, remove_rows


def row(n: int, **extra):
    case = Case.make(suite="s", workload="mha", impl="vanilla", params={"seq_len": n})
    m = Measurement(status="ok", peak_bytes=n, times_s=[0.5, 0.25, 1.0], extra=extra)
    return make_row(case, m)


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


@pytest.mark.parametrize(
    "setup,words",
    [
        (lambda p: None, "no such file or directory"),
        (lambda p: p.mkdir(), "no results CSV"),
        (lambda p: p.write_text("a,b\n1,2\n"), "not a topk-bench results file"),
    ],
)
def test_load_bad_input(tmp_path, setup, words):
    path = tmp_path / "thing"
    setup(path)
    with pytest.raises(BadInput, match=words):
        load_results(path)


def _damaged_results(tmp_path):
    """A directory as a crashed writer and a curious user leave it: rows written by the real writer,
    a label "NA", a row cut after its status (a crash mid-write), and a hidden partial file."""
    out = tmp_path / "out"
    out.mkdir()
    path = out / "s.csv"
    header = columns(["seq_len"])
    for n, label in ((8, "NA"), (16, "null"), (32, "")):
        case = Case.make(suite="s", workload="mha", impl="vanilla", label=label, params={"seq_len": n})
        append_row(path, make_row(case, Measurement(status="ok", peak_bytes=n, times_s=[0.1] * 7)), header)
    good = path.read_text().splitlines()
    cut = good[-1][: good[-1].index(",ok,") + len(",ok,") + 4]  # "...,ok,,3" : status present, rest gone
    path.write_text("\n".join(good[:-1] + [cut]) + "\n")
    (out / ".s.partial.csv").write_text(path.read_text())
    return out, path


def test_every_reader_sees_the_same_valid_rows(tmp_path):
    """One loader: resume (read_rows), show, plot and compare agree on which rows exist, keep the label
    "NA" as text, leave the cut row out (and say so), and ignore hidden files."""
    from topk_bench.report import compare
    from topk_bench.report.plots.inputs import figure_inputs
    from topk_bench.report.show import tables

    out, path = _damaged_results(tmp_path)
    resumed = {r["case_id"] for r in read_rows(path)}
    frame = load_results(out)
    assert len(resumed) == 2 and set(frame["case_id"]) == resumed
    assert frame["label"].tolist() == ["NA", "null"]
    assert len(frame.attrs["dropped"]) == 1 and "s.csv line 4" in frame.attrs["dropped"][0]
    assert set(compare.load(out)["case_id"]) == resumed
    (figure,) = figure_inputs(out)
    assert set(figure.rows["case_id"]) == resumed and figure.rows["label"].tolist() == ["NA", "null"]
    (table,) = tables(out)
    assert table.row_count == 2


def test_a_row_with_an_unknown_status_is_left_out(tmp_path):
    path = tmp_path / "s.csv"
    append_row(path, row(8), columns(["seq_len"]))
    append_row(path, {**row(16), "status": "OK"}, columns(["seq_len"]))
    table = read(path)
    assert [r["seq_len"] for r in table.rows] == ["8"] and "unknown status 'OK'" in table.dropped[0]


def test_a_rewrite_keeps_every_line_it_does_not_understand(tmp_path):
    """Widening the header and --no-resume rewrite the file: a line readers leave out stays as it was."""
    path = tmp_path / "s.csv"
    header = columns(["seq_len"])
    append_row(path, row(8), header)
    with open(path, "a") as f:
        f.write("s,deadbeef,mha,vani\n")  # a line cut by a crash
    append_row(path, row(16), header)
    cut = path.read_text().splitlines()[2]
    append_row(path, row(32, rel_err=0.1), header)  # a new column: one rewrite
    assert cut in path.read_text().splitlines()
    assert [r["seq_len"] for r in read_rows(path)] == ["8", "16", "32"]
    assert remove_rows(path, {row(8)["case_id"]}) == 1
    assert cut in path.read_text().splitlines() and [r["seq_len"] for r in read_rows(path)] == ["16", "32"]


def test_a_value_with_a_line_break_stays_on_its_row_s_line(tmp_path):
    path = tmp_path / "s.csv"
    append_row(path, {**row(8), "label": "two\nlines", "error": "a\r\nb"}, columns(["seq_len"]))
    assert len(path.read_bytes().splitlines()) == 2
    (only,) = read_rows(path)
    assert only["label"] == "two lines" and only["error"] == "a b"


def test_a_damaged_line_cannot_swallow_the_next_one(tmp_path):
    """A quote opened by a cut line would make a whole-file CSV parser read the next row as part of it."""
    path = tmp_path / "s.csv"
    header = columns(["seq_len"])
    append_row(path, row(8), header)
    with open(path, "a") as f:
        f.write('s,deadbeef,mha,vanilla,"Vanilla, cut')  # cut inside a quoted label
    append_row(path, row(16), header)
    table = read(path)
    assert [r["seq_len"] for r in table.rows] == ["8", "16"] and "line 3" in table.dropped[0]


def test_the_first_row_s_own_columns_widen_the_header_it_creates(tmp_path):
    path = tmp_path / "s.csv"
    header = append_row(path, row(8, rel_err=0.25), columns(["seq_len"]))
    assert header[-1] == "rel_err" and read_rows(path)[0]["rel_err"] == "0.25"


def test_the_header_fits_its_rows_unless_a_line_is_longer_or_most_are_shorter(tmp_path):
    """What ``run`` refuses to append to: a crash cuts at most one line; a damaged header misfits many."""
    path = tmp_path / "s.csv"
    header = columns(["seq_len"])
    for n in (8, 16, 32):
        append_row(path, row(n), header)
    text = path.read_text().splitlines()
    cases = {
        "one line cut": (text[:3] + [text[3][:40]], None),
        "rows with an unknown status still fit": (
            [text[0]] + [t.replace(",ok,", ",OK,") for t in text[1:3]] + [text[3][:40]],
            None,
        ),
        "a line longer than the header": (text + [text[1] + ",x"], "line 5 has"),
        "a header one column longer": ([text[0] + ",extra"] + text[1:], "3 line(s) have fewer"),
    }
    for what, (lines, words) in cases.items():
        path.write_text("\n".join(lines) + "\n")
        problem = read(path).header_problem()
        assert (problem is None) if words is None else (words in problem), (what, problem)


def _old_quality_file(path, fidelity=False):
    """A results CSV as a version before issue 25 wrote it: the selection quality's error in ``rel_err``."""
    named = ["grad_cos", "rel_err"] if fidelity else ["topk_recall", "rel_err", "minilm_rel_err"]
    header = columns(["seq_len", "causal", "activation", "dtype"], named)
    old = {name: 0.25 for name in named}
    path.write_text(",".join(header) + "\n")
    line = row(8, **old)
    with open(path, "a") as f:
        f.write(",".join("" if line.get(c) is None else str(line[c]) for c in header) + "\n")
    return header


def test_an_older_file_s_quality_rel_err_is_read_as_attn_rel_err_and_fidelity_s_is_not(tmp_path):
    quality, fidelity = tmp_path / "q.csv", tmp_path / "f.csv"
    _old_quality_file(quality)
    _old_quality_file(fidelity, fidelity=True)
    q = load_results(quality)
    assert "rel_err" not in q.columns and q["attn_rel_err"].tolist() == [0.25]
    assert q["minilm_attn_rel_err"].tolist() == [0.25] and q["topk_recall"].tolist() == [0.25]
    f = load_results(fidelity)
    assert f["rel_err"].tolist() == [0.25] and "attn_rel_err" not in f.columns


def test_a_row_appended_to_an_older_file_lines_up_and_the_next_rewrite_renames_its_header(tmp_path):
    path = tmp_path / "q.csv"
    old_header = _old_quality_file(path)
    current = append_row(
        path,
        row(16, topk_recall=0.5, attn_rel_err=0.125, minilm_attn_rel_err=0.0625),
        [c if c not in ("rel_err", "minilm_rel_err") else f"{c[:-7]}attn_rel_err" for c in old_header],
    )
    table = read(path)
    assert not table.dropped and [r["attn_rel_err"] for r in table.rows] == ["0.25", "0.125"]
    assert [r["minilm_attn_rel_err"] for r in table.rows] == ["0.25", "0.0625"]
    assert path.read_text().splitlines()[0] == ",".join(old_header)  # appended, not rewritten
    append_row(path, row(32, topk_recall=0.5, widened=1.0), current)  # a new column: one rewrite
    assert "attn_rel_err" in path.read_text().splitlines()[0].split(",")
    assert [r["attn_rel_err"] for r in read(path).rows] == ["0.25", "0.125", ""]


def test_one_legend_rule():
    from topk_bench.results.columns import legend

    assert legend("Top-k (k=128)", "topk") == "Top-k (k=128)"
    assert legend("", "topk") == legend(None, "topk") == legend(float("nan"), "topk") == "topk"
