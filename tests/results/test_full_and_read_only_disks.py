"""A full or read-only disk, a short write, a path that is a file or a directory: whole rows only,
one line and exit 2, and a re-run that completes."""

from __future__ import annotations

import errno
import os

import pytest

from faults import fill, tiny_suite, tmpfs
from topk_bench.case import Case, Measurement
from topk_bench.results import store
from topk_bench.results.columns import header as columns
from topk_bench.results.row import make_row

# --- 1. a full disk: rows cut, exit 0 ---------------------------------------------------------------


def test_disk_full_mid_run_is_exit_2_with_only_whole_rows_and_a_rerun_completes(tmp_path, cli):
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
def test_a_short_write_leaves_the_file_as_it_was_without_root(tmp_path, monkeypatch, widen):
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


def test_results_csv_that_is_a_directory_and_out_under_a_file(tmp_path, cli):
    suite = tiny_suite(tmp_path)
    (tmp_path / "out" / "tiny.csv").mkdir(parents=True)
    result = cli("run", suite, "--out", tmp_path / "out")
    assert result.code == 2 and "tiny.csv" in result.error_line and "directory" in result.error_line
    (tmp_path / "file").write_text("x")
    result = cli("run", suite, "--out", tmp_path / "file" / "sub")
    line = result.error_line
    assert result.code == 2 and f"--out: expected a directory, but {tmp_path / 'file'} is a file" in line, line


def test_read_only_out_and_read_only_working_directory(tmp_path, cli, monkeypatch):
    suite = tiny_suite(tmp_path)
    with tmpfs(tmp_path / "ro", "16k", read_only=True) as ro:
        result = cli("run", suite, "--out", ro)
        assert result.code == 2 and str(ro) in result.error_line and "Read-only file system" in result.error_line
        result = cli("run", suite, "--out", ro / "sub")
        assert result.code == 2 and "Read-only file system" in result.error_line
        monkeypatch.chdir(ro)  # no bench.toml: results go to ./results
        result = cli("run", suite)
        assert result.code == 2 and "results" in result.error_line and "Read-only" in result.error_line


def test_plot_out_onto_a_file_or_a_read_only_place(measured, cli, tmp_path):
    suite, out, csv_path = measured
    (tmp_path / "a_file").write_text("x")
    result = cli("plot", out, "--out", tmp_path / "a_file")
    assert result.code == 2 and "a_file" in result.error_line and "--out" in result.error_line
    with tmpfs(tmp_path / "ro", "16k", read_only=True) as ro:
        result = cli("plot", out, "--out", ro)
        assert result.code == 2 and "Read-only file system" in result.error_line


def test_compare_reports_into_a_read_only_place_are_exit_2_not_1(measured, cli, tmp_path):
    suite, out, csv_path = measured
    with tmpfs(tmp_path / "ro", "16k", read_only=True) as ro:
        for flag in ("--markdown", "--json"):
            result = cli("compare", csv_path, csv_path, flag, ro / "report")
            assert result.code == 2, (flag, result.out, result.err)
            assert "Read-only file system" in result.err.strip().splitlines()[-1]


@pytest.mark.parametrize("leave_pages,left_out", [(0, "tiny.meta.json"), (1, "tiny.csv")])
def test_disk_full_while_writing_meta_or_header_leaves_nothing_half_written(tmp_path, cli, leave_pages, left_out):
    suite = tiny_suite(tmp_path, impl_extra=f'label = "{"L" * 5000}"')  # the first row alone needs two pages
    with tmpfs(tmp_path / "disk") as disk:
        fill(disk, leave_bytes=leave_pages * 4096)
        result = cli("run", suite, "--out", disk)
        assert result.code == 2 and "No space left on device" in result.err.strip().splitlines()[-1], result.err
        assert left_out in result.err and "Traceback" not in result.err
        names = sorted(p.name for p in disk.iterdir())
        assert not [n for n in names if n.endswith(".tmp")], names
        assert not (disk / "tiny.csv").exists() or store.read(disk / "tiny.csv").rows, names


def test_a_suite_name_too_long_for_a_file_name_is_bad_input(tmp_path, cli):
    suite = tiny_suite(tmp_path, name="s" * 300, file="long")
    result = cli("run", suite, "--out", tmp_path / "out")
    assert result.code == 2 and ": name: " in result.error_line, result.error_line
    assert not (tmp_path / "out").exists()
