"""The messages a new user meets, as the installed command prints them (a new interpreter, its real streams and
exit code, output not a terminal): an unknown implementation with the closest name, a misspelt `--set` key, the
command that measures contended rows again naming the suite's own file, `list SUITE` with the suite's own first,
and `doctor` within 100 columns. The same messages are tested in-process beside the code that says them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from locations import ROOT
from runner_fakes import FakeRun
from topk_bench.results.columns import LOAD_END, LOAD_START

SUITE = """
name = "mine"
workload = "mha"
causal = true
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
"""


def topk_bench(*argv: object, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # the width of a pipe: 100 columns
    return subprocess.run(
        [sys.executable, "-m", "topk_bench", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    return line


def test_an_unknown_implementation_names_the_closest_one(tmp_path):
    suite = tmp_path / "mine.toml"
    suite.write_text(SUITE.replace('name = "topk"', 'name = "tpok"'))
    line = one_line(topk_bench("run", suite, "--predict", "--out", tmp_path / "out"))
    assert line.startswith(f"topk-bench: error: {suite}: impl[1] (tpok).name: unknown implementation 'tpok'; ")
    assert "did you mean 'topk'?" in line
    assert not (tmp_path / "out").exists()


def test_a_misspelt_set_key_of_run_is_one_line_naming_the_flag_and_the_closest_key(tmp_path):
    suite = tmp_path / "mine.toml"
    suite.write_text(SUITE)
    line = one_line(topk_bench("run", suite, "--predict", "--set", "seqlen=64", "--out", tmp_path / "out"))
    assert line.startswith(
        f"topk-bench: error: {suite}: --set seqlen: not a key of this suite; did you mean 'seq_len'?"
    )
    assert not (tmp_path / "out").exists()


class BusyRun(FakeRun):
    """Every case measured on a busy machine: its row is flagged ``busy``."""

    def __call__(self, case, budget):
        measurement = super().__call__(case, budget)
        measurement.metadata.update({LOAD_START: 1.8, LOAD_END: 1.8})
        return measurement


def test_show_names_the_suite_file_folder_and_set_of_the_contended_rows(cli, tmp_path):
    suite = tmp_path / "mine.toml"
    suite.write_text(SUITE)
    out = tmp_path / "results" / "busy"
    cli.fake = BusyRun()
    assert cli("run", suite, "--device", "cpu", "--out", out, "-q", "--set", "topk=2").code == 0
    done = topk_bench("show", out)
    assert done.returncode == 0, done.stderr
    warning = " ".join(done.stderr.split())
    assert f"topk-bench run {suite} --out {out} --set topk=2 --remeasure busy" in warning, done.stderr
    assert "SUITE" not in warning


def test_list_of_a_suite_shows_its_own_first_within_100_columns():
    done = topk_bench("list", "suites/demo_time.toml")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.index("demo_time: its implementations") < text.index("demo_time: its workload")
    assert text.index("demo_time: its workload") < text.index("every registered implementation and workload")
    assert max(map(len, text.splitlines())) <= 100


def test_doctor_fits_100_columns_when_not_a_terminal(tmp_path):
    plugin = tmp_path / "my_attention.py"  # a plug-in whose check fails: its detail is long
    plugin.write_text(
        "import topk_bench.attention\n"
        "def fn(q, k, v, causal=True, **options):\n"
        "    return q * 0\n"
        "topk_bench.attention.register(topk_bench.attention.Implementation(\n"
        "    name='my_zero_attention_with_a_long_name', fn=fn,"
        " description='returns zeros: every agreement check fails with a long explanation'))\n"
    )
    done = topk_bench("doctor", "--device", "cpu", "--plugins", plugin, timeout=540)
    lines = (done.stdout + done.stderr).splitlines()
    assert "my_zero_attention_with_a_long_name" in done.stdout, done.stdout + done.stderr
    assert max(map(len, lines)) <= 100, max(lines, key=len)


def test_the_suite_file_named_is_the_one_given(tmp_path):
    """A relative path stays as the user typed it: the command they copy works from where they ran it."""
    suite = Path("suites/smoke.toml")
    line = one_line(topk_bench("run", suite, "--predict", "--set", "seq_ln=16", "--out", tmp_path / "o"))
    assert line.startswith("topk-bench: error: suites/smoke.toml: --set seq_ln: ")
