"""Two suites of one ``name`` are two suites: the rows and ``meta.json`` carry the suite's fingerprint, and a
second suite writing into ``OUT/<name>.csv`` with another fingerprint is bad input naming both files, unless
``run --append``; ``plot`` then says that rows of another suite are drawn with this one's settings."""

from __future__ import annotations

import csv
import json

from faults import tiny_suite
from topk_bench.suite.load import load_suite


def _other(tmp_path):
    """A suite named "tiny" too, whose cases differ (another implementation)."""
    suite = tiny_suite(tmp_path, sizes=(16, 32), file="second")
    suite.write_text(suite.read_text().replace('name = "vanilla"', 'name = "qchunk"\nchunk_size = 8'))
    return suite


def test_a_second_suite_of_one_name_is_refused_naming_both_files(cli, tmp_path):
    first, second = tiny_suite(tmp_path, sizes=(16, 32), file="first"), _other(tmp_path)
    out = tmp_path / "out"
    assert cli("run", first, "--out", out, "-q").code == 0
    files = {p: p.read_bytes() for p in (out / "tiny.csv", out / "tiny.meta.json")}
    result = cli("run", second, "--out", out, "-q")
    assert result.code == 2
    line = result.error_line
    assert "tiny.csv" in line and "first.toml" in line and "second.toml" in line and "--append" in line
    assert {p: p.read_bytes() for p in files} == files  # nothing written: not a row, not meta.json

    assert cli("run", second, "--out", out, "-q", "--append").code == 0
    rows = list(csv.DictReader(open(out / "tiny.csv")))
    prints = {load_suite(s).fingerprint for s in (first, second)}
    assert len(rows) == 4 and {r["suite_fingerprint"] for r in rows} == prints and len(prints) == 2
    meta = json.loads((out / "tiny.meta.json").read_text())
    assert meta["fingerprint"] == load_suite(second).fingerprint and meta["suite_file"] == str(second)

    drawn = cli("plot", out, "--out", tmp_path / "plots")
    assert drawn.code == 0, drawn.err
    assert "2 row(s) written by another suite named 'tiny'" in drawn.err


def test_how_a_suite_runs_is_not_what_it_is(cli, tmp_path):
    """Repeats, rounds, budgets and the title do not make another suite: a run with other settings resumes."""
    suite = tiny_suite(tmp_path, sizes=(16, 32))
    out = tmp_path / "out"
    before = load_suite(suite).fingerprint
    assert cli("run", suite, "--out", out, "-q").code == 0
    suite.write_text(suite.read_text().replace("repeats = 1", 'repeats = 3\ntitle = "again"'))
    assert load_suite(suite).fingerprint == before
    again = cli("run", suite, "--out", out)
    assert again.code == 0, again.err
    assert len(list(csv.DictReader(open(out / "tiny.csv")))) == 2
