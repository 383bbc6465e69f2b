"""A sweep too large to start without a word: its case count and estimate first, refused without --yes."""

from __future__ import annotations

from faults import tiny_suite
from topk_bench.results import store

# --- 9. a sweep too large to start without a word ----------------------------------------------------


def test_a_huge_sweep_says_how_many_cases_and_refuses_without_yes(tmp_path, cli):
    suite = tiny_suite(tmp_path, sizes=list(range(16, 16 + 1000)))
    suite.write_text(suite.read_text().replace("[sweep]\n", f"[sweep]\nbatch = {list(range(1, 101))}\n"))
    result = cli("run", suite, "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and "100000 cases, at most 69.7 d" in line and "--yes" in line, line
    assert ": max_cases: " in line and "more than max_cases = 1000" in line, line
    assert not (tmp_path / "out").exists()


def test_the_case_count_and_an_estimate_come_first_and_yes_or_max_cases_allow_more(tmp_path, cli):
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
