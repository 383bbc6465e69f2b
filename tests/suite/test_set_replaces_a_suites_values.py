"""``--set KEY=VALUES`` (run, profile): the suite's values of a key replaced for one run, checked as the suite's
own keys (bad input names --set and the key), said before the run and in meta.json, and the figure's words filled
in from the rows, never the suite's own sizes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from faults import tiny_suite
from locations import ROOT
from topk_bench.errors import BadInput
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags
from topk_bench.suite import overrides
from topk_bench.suite.load import read_suite

TWO = """
name = "two"
workload = "mha"
causal = true
title = "Two methods at 65536 tokens"
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16, 32]
[[impl]]
name = "vanilla"
[[impl]]
name = "topk"
topk = 4
chunk_size = 8
[plot]
x_label = "length (of 65536)"
"""


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(TWO)
    return path


def _params(the_plan, key):
    return sorted({c.param_dict.get(key, c.option_dict.get(key)) for c in the_plan.cases}, key=str)


def test_a_swept_key_a_fixed_one_and_an_option_each_replaced(suite, tmp_path):
    base = plan(suite, Flags(predict=True, out=tmp_path))
    assert _params(base, "seq_len") == [16, 32] and _params(base, "batch") == [1]
    swept = plan(suite, Flags(predict=True, out=tmp_path, sets=("seq_len=64",)))
    assert _params(swept, "seq_len") == [64] and len(swept.cases) == 2
    # A fixed parameter given several values is swept: one case per value and implementation.
    batches = plan(suite, Flags(predict=True, out=tmp_path, sets=("batch=1,2", "seq_len=16")))
    assert _params(batches, "batch") == [1, 2] and len(batches.cases) == 4
    # An option: set in every entry whose implementation has it (top-k's, not vanilla's).
    option = plan(suite, Flags(predict=True, out=tmp_path, sets=("topk=2",)))
    assert {c.impl: c.option_dict.get("topk") for c in option.cases} == {"vanilla": None, "topk": 2}
    # What each replaced, said before the run.
    assert option.notes[0] == "--set topk=2: replaces topk of topk (4)"
    assert swept.notes[0] == "--set seq_len=64: replaces sweep.seq_len = [16, 32]"
    assert option.overrides == {"topk": [2]} and base.overrides == {}


def test_the_suites_words_that_name_a_replaced_size_say_the_drawn_one(suite):
    changed, _ = overrides.apply(read_suite(suite), overrides.parse(["seq_len=64"]))
    assert changed.title == "Two methods at 65536 tokens"  # 65536 is no value of seq_len in the suite
    text = TWO.replace("seq_len = [16, 32]", "seq_len = [16, 65536]")
    suite.write_text(text)
    changed, _ = overrides.apply(read_suite(suite), overrides.parse(["seq_len=64"]))
    assert (changed.title, changed.plot.x_label) == ("Two methods at {seq_len} tokens", "length (of {seq_len})")


@pytest.mark.parametrize(
    "given,key,words",
    [
        ("seq_ln=64", "--set seq_ln", "not a key of this suite; did you mean 'seq_len'?"),
        ("seq_len=abc", "--set seq_len", "expected a positive integer, got 'abc'"),
        ("seq_len=0", "--set seq_len", "expected a positive integer, got 0"),
        ("topk=0", "--set topk", "expected an integer >= 1, got 0"),
        ("heads=3", "--set heads", "divisible"),
        ("seq_len", "--set", "expected KEY=VALUE[,VALUE...]"),
        ("seq_len=16,16", "--set seq_len", "expected distinct values"),
    ],
)
def test_a_bad_set_is_one_line_naming_the_flag_and_the_key(cli, suite, tmp_path, given, key, words):
    result = cli("run", suite, "--predict", "--set", given, "--out", tmp_path / "out")
    assert result.code == 2
    assert f": {key}: " in result.error_line and words in result.error_line, result.error_line
    assert not (tmp_path / "out").exists()


def test_a_key_given_twice_is_bad_input():
    with pytest.raises(BadInput, match="--set seq_len: given twice"):
        Flags(sets=("seq_len=16", "seq_len=32"))


def test_run_set_rows_carry_the_values_and_meta_json_says_what_was_replaced(cli, tmp_path):
    suite = tiny_suite(tmp_path, sizes=(16, 32))
    out = tmp_path / "out"
    result = cli("run", suite, "--out", out, "--set", "seq_len=48,64", "--set", "batch=2")
    assert result.code == 0, result.err
    assert "--set seq_len=48,64: replaces sweep.seq_len = [16, 32]" in result.err
    rows = (out / "tiny.csv").read_text().splitlines()
    header = rows[0].split(",")
    at = {name: header.index(name) for name in ("seq_len", "batch")}
    assert sorted((r.split(",")[at["seq_len"]], r.split(",")[at["batch"]]) for r in rows[1:]) == [
        ("48", "2"),
        ("64", "2"),
    ]
    meta = json.loads((out / "tiny.meta.json").read_text())
    assert meta["overrides"] == {"seq_len": [48, 64], "batch": [2]} and meta["suite_file"] == str(suite)


def test_profile_takes_set_too_through_the_real_command_line(tmp_path):
    """The user's case: a size the suite does not have, predicted and profiled."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "topk_bench",
            "profile",
            "suites/smoke.toml",
            "--case",
            "impl=vanilla,workload=mha,seq_len=48",
            "--set",
            "seq_len=48",
            "--predict",
            "--out",
            str(tmp_path / "p"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "at seq_len=48" in done.stdout
    typo = subprocess.run(
        [sys.executable, "-m", "topk_bench", "profile", "suites/smoke.toml", "--case", "impl=vanilla"]
        + ["--set", "seq_ln=48", "--predict", "--out", str(tmp_path / "q")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert typo.returncode == 2 and typo.stdout == ""
    (line,) = typo.stderr.strip().splitlines()
    assert line.startswith("topk-bench: error: suites/smoke.toml: --set seq_ln: not a key of this suite")
    assert not (tmp_path / "q").exists()


def test_a_set_value_that_breaks_a_rule_of_two_keys_is_blamed_not_the_other_key(cli, tmp_path):
    from faults import tiny_suite

    result = cli("run", tiny_suite(tmp_path), "--set", "d_model=65", "--out", tmp_path / "out")
    assert result.code == 2
    assert result.error_line.endswith("--set d_model: expected d_model (65) divisible by heads (2)"), result.err


MIXED = TWO.replace('name = "vanilla"', 'name = "vanilla"\ndtype = "float32"')


def test_set_dtype_replaces_the_suites_and_every_entrys_dtype(tmp_path):
    (tmp_path / "two.toml").write_text(MIXED)
    base = plan(tmp_path / "two.toml", Flags(predict=True, out=tmp_path))
    assert {c.dtype for c in base.cases} == {"float32"}
    half = plan(tmp_path / "two.toml", Flags(predict=True, out=tmp_path, sets=("dtype=bfloat16",)))
    assert {c.dtype for c in half.cases} == {"bfloat16"} and len(half.cases) == len(base.cases)
    assert any("--set dtype=bfloat16: replaces dtype = " in n and "float32" in n for n in half.notes)


@pytest.mark.parametrize(
    ("given", "words"),
    [("dtype=float8", "expected one of float32, float64, float16, bfloat16, got 'float8'"),
     ("dtype=float32,bfloat16", "takes one value")],
)  # fmt: skip
def test_a_bad_set_dtype_is_one_line_naming_the_flag(cli, suite, tmp_path, given, words):
    result = cli("run", suite, "--predict", "--set", given, "--out", tmp_path / "out")
    assert result.code == 2 and ": --set dtype: " in result.error_line and words in result.error_line, result.err


def test_set_grows_a_folder_of_the_same_suite_and_the_remeasure_hint_names_each_rows_run(cli, suite, tmp_path):
    from topk_bench.results.frame import load_results, runs_of

    out = tmp_path / "out"
    assert cli("run", suite, "--out", out).code == 0
    grown = cli("run", suite, "--out", out, "--set", "seq_len=64")
    assert grown.code == 0, grown.err
    assert cli("run", suite, "--out", out, "--set", "dtype=bfloat16", "--set", "seq_len=16").code == 0
    frame = load_results(out)
    assert len(frame) == 4 + 2 + 2
    every = runs_of(frame)
    assert every == [f"{suite} --out {out}", f"{suite} --out {out} --set seq_len=64",
                     f"{suite} --out {out} --set dtype=bfloat16 --set seq_len=16"]  # fmt: skip
    # The command for the rows at 64 tokens measures them: their run's --set, not the latest run's.
    at_64 = frame["seq_len"].astype(int) == 64
    assert runs_of(frame, at_64) == [f"{suite} --out {out} --set seq_len=64"]
    again = cli("run", suite, "--out", out, "--set", "seq_len=64", "--no-resume")
    assert again.code == 0 and "2 case" in again.err, again.err


def test_an_edited_suite_in_the_same_folder_is_named_as_an_earlier_version_of_the_file(cli, suite, tmp_path):
    out = tmp_path / "out"
    assert cli("run", suite, "--out", out).code == 0
    suite.write_text(TWO.replace("seq_len = [16, 32]", "seq_len = [16, 48]"))
    result = cli("run", suite, "--out", out)
    assert result.code == 2 and f"holds the rows of an earlier version of {suite}" in result.error_line, result.err
