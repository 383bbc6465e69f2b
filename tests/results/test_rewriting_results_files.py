"""Rewriting a results file: a wider header keeps lines of the older width readable, a symlink stays a
link, two processes never collide on a temporary name."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from faults import tiny_suite
from locations import ROOT


def _rewritten(csv_path: Path, target: Path, **columns) -> Path:
    """A copy of the results CSV with every row's ``columns`` set (a value, or a list: one per row)."""
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    for column, value in columns.items():
        frame[column] = value
    target.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(target, index=False)
    return target


# --- widening the header keeps lines of the older width readable -------------------------------------


def test_widening_the_header_relays_lines_left_out_so_the_next_run_accepts_the_file(measured_csv, cli, tmp_path):
    """Three rows of another version (a status this one does not know) stay in the file; a run whose cases
    need a new column widens the header. Those lines must widen with it (their cells kept, the new ones
    empty): left at the old width they outnumber the whole lines and the next run refused the file as damaged."""
    from topk_bench.results import store

    foreign = _rewritten(
        measured_csv, measured_csv, status="frobnicated"
    )  # (not "preempted": a status since issue 29 part A)
    before = [line.split(",") for line in foreign.read_text().splitlines()[1:]]
    suite = tiny_suite(tmp_path, sizes=(16,), file="other", impl_extra="", extra="")
    suite.write_text(suite.read_text().replace('name = "vanilla"', 'name = "qchunk"\nchunk_size = 8'))
    out = measured_csv.parent
    assert cli("run", suite, "--out", out, "-q").code == 0
    table = store.read(measured_csv)
    assert "chunk_size" in table.header and table.header_problem() is None, table.header_problem()
    assert len(table.rows) == 1 and len(table.dropped) == 3 and all("frobnicated" in d for d in table.dropped)
    kept = [line.split(",") for line in measured_csv.read_text().splitlines()[1:] if "frobnicated" in line]
    assert [fields[: len(before[0])] for fields in kept] == before  # every cell as it was, new ones empty after
    again = cli("run", suite, "--out", out, "-q")
    assert again.code == 0, again.err


# --- low: temporary names, symlinks, a byte-order mark -------------------------------------------------


def test_two_processes_replacing_one_file_never_collide_on_a_temporary_name(tmp_path):
    """Two `plot` runs into one --out wrote the same figure through one temporary name: one process's rename
    found it gone (or renamed the other's half-written bytes)."""
    import subprocess
    import sys

    target = tmp_path / "figure.png"
    script = (
        "import sys\nfrom topk_bench import fileio\n"
        "data = sys.argv[2].encode() * 20000\n"
        "for _ in range(300):\n    fileio.write_atomic(sys.argv[1], data)\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(target), mark], stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for mark in "AB"
    ]
    errors = [(p.wait(300), p.stderr.read()) for p in procs]
    assert errors == [(0, ""), (0, "")], errors
    assert target.read_bytes() in (b"A" * 20000, b"B" * 20000)
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]  # no temporary file left behind


def test_a_symlinked_results_csv_stays_a_link_when_its_header_widens(measured_csv, cli, tmp_path):
    elsewhere = tmp_path / "kept" / "tiny.csv"
    elsewhere.parent.mkdir()
    measured_csv.rename(elsewhere)
    measured_csv.symlink_to(elsewhere)
    suite = tiny_suite(tmp_path, sizes=(16,), file="other")
    suite.write_text(suite.read_text().replace('name = "vanilla"', 'name = "qchunk"\nchunk_size = 8'))
    # Another suite of the same name (its cases differ): its rows join the file only when told to.
    assert cli("run", suite, "--out", measured_csv.parent, "-q", "--append").code == 0
    assert measured_csv.is_symlink() and measured_csv.resolve() == elsewhere.resolve()
    assert "chunk_size" in elsewhere.read_text().splitlines()[0] and len(elsewhere.read_text().splitlines()) == 5
