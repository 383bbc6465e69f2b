"""An unknown name in a suite is always named, with the closest known one (difflib) when there is one: a misspelt
required key, an implementation, a workload, an option, a shape parameter, a swept key, a --case key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from faults import tiny_suite
from locations import ROOT
from topk_bench.errors import did_you_mean

SUITE = """
name = "named"
workload = "mha"
causal = true
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16, 32]
[[impl]]
name = "topk"
topk = 4
chunk_size = 8
"""


@pytest.mark.parametrize(
    "edit,key,words",
    [
        # Misspelt, the required key is also missing: the file's own key is the one named.
        (("workload = ", "worklaod = "), "worklaod", "unknown key; did you mean 'workload'? (expected one of: name,"),
        (
            ('name = "topk"', 'name = "tpok"'),
            "impl[0] (tpok).name",
            "unknown implementation 'tpok'; did you mean 'topk'?",
        ),
        (('workload = "mha"', 'workload = "mah"'), "workload", "unknown workload 'mah'; did you mean 'mha'?"),
        (("topk = 4", "topK = 4"), "impl[0] (topk).topK", "has no option 'topK'; did you mean 'topk'?"),
        (("heads = 2", "heads = 2\nbacth = 1"), "shape.bacth", "did you mean 'batch'?"),
        (("seq_len = [16, 32]", "seq_len = [16]\nchunksize = [8]"), "sweep.chunksize", "did you mean 'chunk_size'?"),
    ],
)
def test_an_unknown_name_is_named_with_the_closest_known_one(cli, tmp_path, edit, key, words):
    suite = tmp_path / "named.toml"
    suite.write_text(SUITE.replace(*edit))
    result = cli("run", suite, "--predict", "--out", tmp_path / "out")
    assert result.code == 2
    assert result.error_line.startswith(f"topk-bench: error: {suite}: {key}: ") and words in result.error_line
    assert not (tmp_path / "out").exists()


def test_a_name_close_to_none_gets_the_plugin_hint_and_no_guess(cli, tmp_path):
    suite = tmp_path / "named.toml"
    suite.write_text(SUITE.replace('name = "topk"', 'name = "my_attention"'))
    line = cli("run", suite, "--predict", "--out", tmp_path / "out").error_line
    assert "did you mean" not in line and 'add it with `plugins = ["your.module"]`' in line


def test_did_you_mean_is_difflibs_closest_or_nothing():
    assert did_you_mean("vanila", ["vanilla", "sdpa"]) == "; did you mean 'vanilla'?"
    assert did_you_mean("SDPA", ["vanilla", "sdpa"]) == "; did you mean 'sdpa'?"
    assert did_you_mean("zzz", ["vanilla", "sdpa"]) == ""


def test_a_case_key_of_profile_is_guessed_too(cli, tmp_path):
    suite = tiny_suite(tmp_path)
    line = cli("profile", suite, "--case", "seq_ln=16", "--predict", "--out", tmp_path / "p").error_line
    assert "--case: unknown key 'seq_ln'; did you mean 'seq_len'?" in line


def test_through_the_real_command_line_one_line_exit_2(tmp_path):
    suite = tmp_path / "named.toml"
    suite.write_text(SUITE.replace("workload = ", "worklaod = "))
    done = subprocess.run(
        [sys.executable, "-m", "topk_bench", "run", str(suite), "--predict", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"topk-bench: error: {suite}: worklaod: unknown key; did you mean 'workload'?")
    assert not (tmp_path / "out").exists()
