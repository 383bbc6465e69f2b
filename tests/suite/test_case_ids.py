"""Two [[impl]] entries never give one case: a label alone does not make a case, an option does, and the
committed CI baseline keeps its case ids."""

from __future__ import annotations

import pandas as pd

from faults import tiny_suite
from locations import ROOT
from topk_bench.run.resolve import Flags

# --- two [[impl]] entries that differ only in their label ---------------------------------------------


def test_two_entries_that_differ_only_in_label_are_bad_input(tmp_path, cli):
    """They would share every case_id: compare of a folder with itself failed forever, show printed one."""
    suite = tiny_suite(tmp_path, impl_extra='label = "A"\n[[impl]]\nname = "vanilla"\nlabel = "B"')
    result = cli("run", suite, "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and str(suite) in line and "impl[1] (vanilla)" in line, line
    assert "impl[0]" in line and "label" in line, line
    assert not (tmp_path / "out").exists()


def test_entries_that_differ_in_an_option_keep_their_case_ids(tmp_path, cli):
    """The committed CI baseline keys by case_id: a suite without duplicates keeps its ids."""
    from topk_bench.run.plan import plan

    base = ROOT / "baselines" / "ci-predicted.csv"
    planned = plan(ROOT / "suites" / "ci.toml", Flags(predict=True, out=tmp_path))
    assert {c.case_id for c in planned.cases} == set(pd.read_csv(base)["case_id"])


# --- an entry's own dtype -----------------------------------------------------------------------------


def test_an_entrys_dtype_makes_its_own_cases_and_rows_say_it(tmp_path, cli):
    """One suite times a bf16 step beside an fp32 one: the entry's dtype is the case's, and a different case."""
    from topk_bench import load_results
    from topk_bench.run.plan import plan

    suite = tiny_suite(tmp_path, impl_extra='[[impl]]\nname = "vanilla"\ndtype = "bfloat16"')
    cases = plan(suite, Flags(predict=True, out=tmp_path / "p")).cases
    dtypes = {(c.impl, str(c.dtype)) for c in cases}
    assert {d for _, d in dtypes} == {"float32", "bfloat16"}, dtypes
    assert len({c.case_id for c in cases}) == len(cases) == 4
    result = cli("run", suite, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    rows = load_results(tmp_path / "out" / "tiny.csv")
    assert sorted(rows["dtype"]) == ["bfloat16", "bfloat16", "float32", "float32"]


def test_an_unknown_entry_dtype_is_bad_input(tmp_path, cli):
    suite = tiny_suite(tmp_path, impl_extra='dtype = "float8"')
    result = cli("run", suite, "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and str(suite) in line and "impl[0]" in line and "dtype" in line, line
    assert not (tmp_path / "out").exists()
