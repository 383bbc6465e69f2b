"""Results you can trust under faults (issue 18): one test per finding, each through the command line a user types.

Bad files, full and read-only disks, odd statistics: no row is lost or
misreported, no gate passes on nothing, and every failure is one line with
exit code 2, never a traceback.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pandas as pd
import pytest

from faults import Cli, fill, tiny_suite, tmpfs, tree
from topk_bench.case import Case, Measurement
from topk_bench.child import execute as child
from topk_bench.child.execute import measure
from topk_bench.report.stats import Verdict, classify_ratio, classify_samples
from topk_bench.results import store
from topk_bench.results.columns import header as columns
from topk_bench.results.row import make_row
from topk_bench.status import STATUSES, Status

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture
def cli(monkeypatch, capsys):
    return Cli(monkeypatch, capsys)


@pytest.fixture
def measured(tmp_path, cli):
    """A results directory written by `run` of the tiny suite (3 cases, the scripted executor): (suite, out, csv)."""
    suite = tiny_suite(tmp_path, sizes=(16, 32, 64))
    out = tmp_path / "out"
    assert cli("run", suite, "--out", out, "-q").code == 0
    return suite, out, out / "tiny.csv"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def write_lines(path: Path, text_lines: list[str]) -> None:
    path.write_text("\n".join(text_lines) + "\n")


# --- 1. a full disk: rows cut, exit 0 ---------------------------------------------------------------

def test_1_disk_full_mid_run_is_exit_2_with_only_whole_rows_and_a_rerun_completes(tmp_path, cli):
    """A 64 KiB tmpfs with room for meta.json and one page of CSV: the third row does not fit."""
    suite = tiny_suite(tmp_path, sizes=(16, 32, 64), impl_extra=f'label = "{"L" * 1500}"')
    with tmpfs(tmp_path / "disk") as disk:
        filler = fill(disk, leave_bytes=2 * 4096)
        result = cli("run", suite, "--out", disk)
        csv_path = disk / "tiny.csv"
        # One line says what failed and where; no "ok" for the row that is not on disk.
        last = result.err.strip().splitlines()[-1]
        assert result.code == 2 and "Traceback" not in result.err, result.err
        assert last.startswith(f"topk-bench: error: {csv_path}: ") and "No space left on device" in last, last
        written = store.read(csv_path)
        assert 1 <= len(written.rows) < 3 and written.dropped == []
        assert csv_path.read_bytes().endswith(b"\n")
        assert result.err.count(": ok ") == len(written.rows)
        assert not [p.name for p in disk.iterdir() if p.name.endswith(".tmp")]

        filler.unlink()
        again = cli("run", suite, "--out", disk, "-q")
        assert again.code == 0, again.err
        final = store.read(csv_path)
        assert len(final.rows) == 3 and final.dropped == [] and len({r["case_id"] for r in final.rows}) == 3
        shown = cli("show", disk, "--wide")
        assert shown.code == 0 and "tiny (3 rows)" in shown.out


def _half_then_full(monkeypatch) -> list[int]:
    """os.write writes half of what it is asked, then the disk is full; returns the sizes asked."""
    real_write, calls = os.write, []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.os, "write", write)
    return calls


@pytest.mark.parametrize("widen", [False, True])
def test_1_a_short_write_leaves_the_file_as_it_was_without_root(tmp_path, monkeypatch, widen):
    """The same mechanism without a real disk: an append (or a rewrite that widens the header) cut short."""
    path = tmp_path / "r.csv"
    header = store.append_row(path, _row(16), columns(["seq_len"]))
    before = path.read_bytes()
    calls = _half_then_full(monkeypatch)
    with pytest.raises(Exception) as info:
        store.append_row(path, {**_row(32), **({"rel_err": 0.5} if widen else {})}, header)
    monkeypatch.undo()
    assert "No space left on device" in str(info.value) and str(path) in str(info.value)
    assert path.read_bytes() == before and len(calls) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]


def _row(seq_len: int) -> dict:
    case = Case.make(suite="s", workload="mha", impl="vanilla", params={"seq_len": seq_len})
    return make_row(case, Measurement(status="ok", peak_bytes=seq_len, times_s=[0.1]))


# --- 2. a header one column shorter than its rows ----------------------------------------------------

@pytest.mark.parametrize("predict", [False, True])
def test_2_header_shorter_than_its_rows_is_refused_by_run_and_loses_nothing(measured, cli, predict):
    suite, out, csv_path = measured
    text = lines(csv_path)
    write_lines(csv_path, [text[0].rsplit(",", 1)[0]] + text[1:])  # the last column name is gone
    before = tree(out)
    result = cli("run", suite, "--out", out, *(["--predict"] if predict else []))
    line = result.error_line
    assert result.code == 2 and str(csv_path) in line and "header" in line, line
    assert tree(out) == before


def test_2_readers_say_which_lines_they_left_out(measured, cli, tmp_path):
    suite, out, csv_path = measured
    base = tmp_path / "base.csv"
    base.write_bytes(csv_path.read_bytes())
    text = lines(csv_path)
    write_lines(csv_path, [text[0].rsplit(",", 1)[0]] + text[1:])
    width = len(text[0].split(","))
    shown = cli("show", csv_path)
    assert f"tiny.csv line 2: {width} fields where the header has {width - 1} (a damaged header?)" in shown.err, \
        shown.err
    compared = cli("compare", base, csv_path)
    assert compared.code == 1, compared.out
    assert "nothing compared" in compared.out and "tiny.csv line 2" in compared.out


# --- 3. a row cut after its status -------------------------------------------------------------------

def test_3_a_row_cut_after_its_status_is_left_out_by_every_reader(measured, cli, tmp_path):
    suite, out, csv_path = measured
    base = tmp_path / "base.csv"
    base.write_bytes(csv_path.read_bytes())
    text = lines(csv_path)
    cut = text[-1][: text[-1].index(",ok,") + len(",ok,,3")]  # "...,ok,,3": status kept, the rest gone
    write_lines(csv_path, text[:-1] + [cut])
    shown = cli("show", csv_path, "--wide")
    assert "tiny (2 rows)" in shown.out and "tiny.csv line 4" in shown.err
    compared = cli("compare", base, csv_path)
    assert compared.code == 1 and "3 B" not in compared.out  # no verdict on the cut peak
    assert "tiny.csv line 4" in compared.out and "missing" in compared.out


# --- 4. gates that pass on nothing -------------------------------------------------------------------

def test_4_compare_fails_when_new_has_no_valid_rows(measured, cli, tmp_path):
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


def test_4_compare_fails_when_cases_went_missing_unless_allowed(measured, cli, tmp_path):
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


@pytest.mark.parametrize("cells,why", [
    ({"times_s": "nan"}, "times_s"),
    ({"times_s": "0.1;inf"}, "times_s"),
    ({"peak_bytes": "nan"}, "peak_bytes"),
    ({"peak_bytes": "-1000"}, "peak_bytes"),
    ({"time_median_s": "-0.5"}, "time_median_s"),
])
def test_5_non_finite_or_negative_numbers_fail_compare_in_both_directions(measured, cli, tmp_path, cells, why):
    suite, out, csv_path = measured
    bad = _with(csv_path, tmp_path / "bad.csv", **cells)
    for base, new in ((csv_path, bad), (bad, csv_path)):
        result = cli("compare", base, new)
        assert result.code == 1, result.out
        assert "bad.csv line 2" in result.out and why in result.out, result.out
        assert "no regression" not in result.out


def test_5_statistics_refuse_non_finite_and_negative_inputs():
    nan, inf, good = float("nan"), float("inf"), [0.01] * 7
    for base, new in (([nan] * 7, good), (good, [nan] * 7), ([0.01, -0.02] * 4, good), (good, [inf] * 7)):
        result = classify_samples("time_s", base, new, 1.1, 0.002)
        assert result.verdict is Verdict.INVALID, result
    for base, new in ((nan, 1.0), (1.0, nan), (1000.0, -1.0), (-5.0, 5.0), (inf, 1.0)):
        assert classify_ratio("peak_bytes", base, new, 1.001).verdict is Verdict.INVALID


# --- 6. ties -----------------------------------------------------------------------------------------

def test_6_fully_separated_samples_with_ties_are_a_regression():
    base = [0.010, 0.010, 0.011, 0.011, 0.012, 0.012, 0.013]
    new = [10 * t for t in base]
    result = classify_samples("time_s", base, new, 1.1, 0.002)
    assert result.verdict is Verdict.REGRESSION, result
    assert result.p_value == pytest.approx(2 / 3432)  # the exact p: one arrangement of C(14, 7) on each side


def test_6_ties_that_keep_the_test_from_reaching_alpha_are_inconclusive_not_unchanged():
    # 10 samples share one value: no arrangement of these 14 values gives p < 0.07.
    base, new = [0.01] * 7, [0.01] * 3 + [0.1] * 4
    result = classify_samples("time_s", base, new, 1.1, 0.002)
    assert result.verdict is Verdict.INCONCLUSIVE, result
    assert result.min_p_value == pytest.approx(2 * 120 / 3432) and "ties" in result.note


# --- 7. a plug-in that exits at import ---------------------------------------------------------------

def test_7_a_plugin_calling_sys_exit_at_import_is_bad_input(tmp_path, cli):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    suite = tiny_suite(tmp_path, extra='plugins = ["quits.py"]')
    result = cli("run", suite, "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and "plugins" in line and "SystemExit" in line, line
    assert not (tmp_path / "out").exists()


def test_7_a_plugin_exiting_in_the_child_is_an_error_row(tmp_path):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    case = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2},
                     plugins=(str(tmp_path / "quits.py"),))
    result = child.execute(case)
    assert result.status == Status.ERROR and "SystemExit" in result.error


def test_7_prints_at_plugin_import_stay_off_stdout(tmp_path, cli):
    (tmp_path / "chatty.py").write_text("print('hello from a plug-in')\n")
    suite = tiny_suite(tmp_path, extra='plugins = ["chatty.py"]')
    result = cli("run", suite, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    assert "hello from a plug-in" not in result.out and "hello from a plug-in" in result.err


# --- 8. filesystem errors: one line, exit 2 ----------------------------------------------------------

def _rename_case_id(path: Path) -> None:
    text = lines(path)
    write_lines(path, [text[0].replace("case_id", "case", 1)] + text[1:])


def _binary(path: Path) -> None:
    # Not random: random bytes can hold a newline early and make a short first line that decodes.
    path.write_bytes(b"\xff\xfe\x80" * 700 + b"\n")


@pytest.mark.parametrize("damage,words", [
    (_rename_case_id, "no column 'case_id'"),
    (_binary, "not UTF-8"),
])
def test_8_damaged_results_file_is_one_line_for_run_and_show(measured, cli, damage, words):
    suite, out, csv_path = measured
    damage(csv_path)
    before = tree(out)
    for args in (("run", suite, "--out", out), ("show", out), ("show", csv_path)):
        result = cli(*args)
        line = result.error_line
        assert result.code == 2 and str(csv_path) in line and words in line, (args, line)
    assert tree(out) == before


def test_8_results_csv_that_is_a_directory_and_out_under_a_file(tmp_path, cli):
    suite = tiny_suite(tmp_path)
    (tmp_path / "out" / "tiny.csv").mkdir(parents=True)
    result = cli("run", suite, "--out", tmp_path / "out")
    assert result.code == 2 and "tiny.csv" in result.error_line and "directory" in result.error_line
    (tmp_path / "file").write_text("x")
    result = cli("run", suite, "--out", tmp_path / "file" / "sub")
    line = result.error_line
    assert result.code == 2 and f"--out: expected a directory, but {tmp_path / 'file'} is a file" in line, line


def test_8_read_only_out_and_read_only_working_directory(tmp_path, cli, monkeypatch):
    suite = tiny_suite(tmp_path)
    with tmpfs(tmp_path / "ro", "16k", read_only=True) as ro:
        result = cli("run", suite, "--out", ro)
        assert result.code == 2 and str(ro) in result.error_line and "Read-only file system" in result.error_line
        result = cli("run", suite, "--out", ro / "sub")
        assert result.code == 2 and "Read-only file system" in result.error_line
        monkeypatch.chdir(ro)  # no bench.toml: results go to ./results
        result = cli("run", suite)
        assert result.code == 2 and "results" in result.error_line and "Read-only" in result.error_line


def test_8_plot_out_onto_a_file_or_a_read_only_place(measured, cli, tmp_path):
    suite, out, csv_path = measured
    (tmp_path / "a_file").write_text("x")
    result = cli("plot", out, "--out", tmp_path / "a_file")
    assert result.code == 2 and "a_file" in result.error_line and "--out" in result.error_line
    with tmpfs(tmp_path / "ro", "16k", read_only=True) as ro:
        result = cli("plot", out, "--out", ro)
        assert result.code == 2 and "Read-only file system" in result.error_line


def test_8_compare_reports_into_a_read_only_place_are_exit_2_not_1(measured, cli, tmp_path):
    suite, out, csv_path = measured
    with tmpfs(tmp_path / "ro", "16k", read_only=True) as ro:
        for flag in ("--markdown", "--json"):
            result = cli("compare", csv_path, csv_path, flag, ro / "report")
            assert result.code == 2, (flag, result.out, result.err)
            assert "Read-only file system" in result.err.strip().splitlines()[-1]


@pytest.mark.parametrize("leave_pages,left_out", [(0, "tiny.meta.json"), (1, "tiny.csv")])
def test_8_disk_full_while_writing_meta_or_header_leaves_nothing_half_written(tmp_path, cli, leave_pages, left_out):
    suite = tiny_suite(tmp_path, impl_extra=f'label = "{"L" * 5000}"')  # the first row alone needs two pages
    with tmpfs(tmp_path / "disk") as disk:
        fill(disk, leave_bytes=leave_pages * 4096)
        result = cli("run", suite, "--out", disk)
        assert result.code == 2 and "No space left on device" in result.err.strip().splitlines()[-1], result.err
        assert left_out in result.err and "Traceback" not in result.err
        names = sorted(p.name for p in disk.iterdir())
        assert not [n for n in names if n.endswith(".tmp")], names
        assert not (disk / "tiny.csv").exists() or store.read(disk / "tiny.csv").rows, names


def test_8_a_suite_name_too_long_for_a_file_name_is_bad_input(tmp_path, cli):
    suite = tiny_suite(tmp_path, name="s" * 300, file="long")
    result = cli("run", suite, "--out", tmp_path / "out")
    assert result.code == 2 and ": name: " in result.error_line, result.error_line
    assert not (tmp_path / "out").exists()


# --- 9. a sweep too large to start without a word ----------------------------------------------------

def test_9_a_huge_sweep_says_how_many_cases_and_refuses_without_yes(tmp_path, cli):
    suite = tiny_suite(tmp_path, sizes=list(range(16, 16 + 1000)))
    suite.write_text(suite.read_text().replace("[sweep]\n", f"[sweep]\nbatch = {list(range(1, 101))}\n"))
    result = cli("run", suite, "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and "100000 cases, at most 69.7 d" in line and "--yes" in line, line
    assert ": max_cases: " in line and "more than max_cases = 1000" in line, line
    assert not (tmp_path / "out").exists()


def test_9_the_case_count_and_an_estimate_come_first_and_yes_or_max_cases_allow_more(tmp_path, cli):
    suite = tiny_suite(tmp_path, sizes=(16, 32, 64))
    result = cli("run", suite, "--out", tmp_path / "a")
    assert result.code == 0
    first = result.err.strip().splitlines()[0]
    assert first.startswith("3 cases to run") and "estimate" in first, first
    small = tiny_suite(tmp_path, name="small", sizes=(16, 32, 64), extra="max_cases = 2")
    refused = cli("run", small, "--out", tmp_path / "b")
    assert refused.code == 2 and "3 cases, " in refused.error_line and "max_cases = 2" in refused.error_line
    assert cli("run", small, "--out", tmp_path / "b", "--yes", "-q").code == 0
    assert len(store.read(tmp_path / "b" / "small.csv").rows) == 3


# --- 10. a FIFO named *.csv ----------------------------------------------------------------------------

def _returns_within(seconds: float, fn) -> bool:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (fn(), done.set()), daemon=True)
    thread.start()
    return done.wait(seconds)


@pytest.mark.parametrize("target", ["directory", "file"])
def test_10_show_does_not_hang_on_a_fifo(measured, cli, target):
    suite, out, csv_path = measured
    fifo = out / "pipe.csv"
    os.mkfifo(fifo)
    results = []
    try:
        assert _returns_within(10, lambda: results.append(cli("show", out if target == "directory" else fifo, "--wide")))
    finally:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK) if not results else None  # release a blocked reader
        if fd is not None:
            os.close(fd)
    result = results[0]
    if target == "directory":
        assert result.code == 0 and "tiny (3 rows)" in result.out
    else:
        assert result.code == 2 and "not a regular file" in result.error_line


# --- also: duplicate case_ids ------------------------------------------------------------------------

def test_duplicate_case_ids_are_shown_once_and_said(measured, cli, tmp_path):
    suite, out, csv_path = measured
    text = lines(csv_path)
    write_lines(csv_path, text + [text[1]])
    shown = cli("show", csv_path, "--wide")
    assert "tiny (3 rows)" in shown.out and "tiny.csv line 5" in shown.err and "line 2" in shown.err, shown.err
    base = tmp_path / "base.csv"
    write_lines(base, text)
    compared = cli("compare", base, csv_path)
    assert compared.code == 1 and "tiny.csv line 5" in compared.out


# --- also: a NaN output is a status of its own ---------------------------------------------------------

def _nan_case(tmp_path, mode="fwd_bwd", fidelity=False, which="nan_output") -> Case:
    return Case.make(suite="t", workload="mha", impl=which, params={"seq_len": 8, "d_model": 8, "heads": 2},
                     mode=mode, warmup=0, repeats=2, fidelity=fidelity, plugins=(str(PLUGINS / "nonfinite_impls.py"),))


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_a_nan_output_is_status_nonfinite_with_its_measurement(tmp_path, mode, single_thread):
    result = child.execute(_nan_case(tmp_path, mode))
    assert result.status == Status.NONFINITE == "nonfinite" and "nonfinite" in STATUSES
    assert "NaN" in result.error and result.peak_bytes > 0 and len(result.times_s) == 2


def test_a_nan_gradient_is_nonfinite_and_fidelity_is_not_computed(tmp_path, single_thread):
    result = child.execute(_nan_case(tmp_path, which="nan_gradient", fidelity=True))
    assert result.status == Status.NONFINITE and "gradient" in result.error
    assert "rel_err" not in result.extra


def test_a_nan_error_metric_is_nonfinite(monkeypatch, single_thread):
    from topk_bench.extras import columns as extras

    monkeypatch.setattr(extras, "layer_columns", lambda case, budget: {"rel_err": float("nan"), "grad_cos": 1.0})
    case = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2},
                     warmup=0, repeats=1, fidelity=True)
    result = child.execute(case)
    assert result.status == Status.NONFINITE and "rel_err = nan" in result.error


def test_a_finite_output_stays_ok(single_thread):
    case = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2},
                     warmup=0, repeats=1)
    assert measure(case).status == Status.OK


def test_nonfinite_in_new_is_a_regression(measured, cli, tmp_path):
    suite, out, csv_path = measured
    new = tmp_path / "new.csv"
    write_lines(new, [lines(csv_path)[0]] + [line.replace(",ok,", ",nonfinite,") for line in lines(csv_path)[1:]])
    result = cli("compare", csv_path, new)
    assert result.code == 1 and "ok → nonfinite" in result.out
