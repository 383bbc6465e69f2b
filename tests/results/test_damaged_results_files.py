"""A damaged results file (a short header, a cut row, binary bytes, a FIFO, duplicate case ids): no
reader loses a valid row or hangs, and each says which lines it left out."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from faults import tree


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def write_lines(path: Path, text_lines: list[str]) -> None:
    path.write_text("\n".join(text_lines) + "\n")


# --- 2. a header one column shorter than its rows ----------------------------------------------------


@pytest.mark.parametrize("predict", [False, True])
def test_header_shorter_than_its_rows_is_refused_by_run_and_loses_nothing(measured, cli, predict):
    suite, out, csv_path = measured
    text = lines(csv_path)
    write_lines(csv_path, [text[0].rsplit(",", 1)[0]] + text[1:])  # the last column name is gone
    before = tree(out)
    result = cli("run", suite, "--out", out, *(["--predict"] if predict else []))
    line = result.error_line
    assert result.code == 2 and str(csv_path) in line and "header" in line, line
    assert tree(out) == before


def test_readers_say_which_lines_they_left_out(measured, cli, tmp_path):
    suite, out, csv_path = measured
    base = tmp_path / "base.csv"
    base.write_bytes(csv_path.read_bytes())
    text = lines(csv_path)
    write_lines(csv_path, [text[0].rsplit(",", 1)[0]] + text[1:])
    width = len(text[0].split(","))
    shown = cli("show", csv_path)
    assert f"tiny.csv line 2: {width} fields where the header has {width - 1} (a damaged header?)" in shown.err, (
        shown.err
    )
    compared = cli("compare", base, csv_path)
    assert compared.code == 1, compared.out
    assert "nothing compared" in compared.out and "tiny.csv line 2" in compared.out


# --- 3. a row cut after its status -------------------------------------------------------------------


def test_a_row_cut_after_its_status_is_left_out_by_every_reader(measured, cli, tmp_path):
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


# --- 8. filesystem errors: one line, exit 2 ----------------------------------------------------------


def _rename_case_id(path: Path) -> None:
    text = lines(path)
    write_lines(path, [text[0].replace("case_id", "case", 1)] + text[1:])


def _binary(path: Path) -> None:
    # Not random: random bytes can hold a newline early and make a short first line that decodes.
    path.write_bytes(b"\xff\xfe\x80" * 700 + b"\n")


@pytest.mark.parametrize(
    "damage,words",
    [
        (_rename_case_id, "no column 'case_id'"),
        (_binary, "not UTF-8"),
    ],
)
def test_damaged_results_file_is_one_line_for_run_and_show(measured, cli, damage, words):
    suite, out, csv_path = measured
    damage(csv_path)
    before = tree(out)
    for args in (("run", suite, "--out", out), ("show", out), ("show", csv_path)):
        result = cli(*args)
        line = result.error_line
        assert result.code == 2 and str(csv_path) in line and words in line, (args, line)
    assert tree(out) == before


# --- 10. a FIFO named *.csv ----------------------------------------------------------------------------


def _returns_within(seconds: float, fn) -> bool:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (fn(), done.set()), daemon=True)
    thread.start()
    return done.wait(seconds)


@pytest.mark.parametrize("target", ["directory", "file"])
def test_show_does_not_hang_on_a_fifo(measured, cli, target):
    suite, out, csv_path = measured
    fifo = out / "pipe.csv"
    os.mkfifo(fifo)
    results = []
    try:
        assert _returns_within(
            10, lambda: results.append(cli("show", out if target == "directory" else fifo, "--wide"))
        )
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
