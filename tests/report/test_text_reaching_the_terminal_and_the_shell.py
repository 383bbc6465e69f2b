"""Text from a file or an argument reaches the terminal as text and the shell as one word: a printed command
quotes the suite file and the results folder it names (a suite named ``x.toml; touch PWNED; #`` is pasted as a
file name, not run), and an error line shows a name's escape sequences as ``\\x1b`` (no title set, no screen
cleared), the same for ``--case``'s value."""

from __future__ import annotations

import shlex
import subprocess

from faults import tiny_suite
from runner_fakes import FakeRun
from topk_bench.results.columns import LOAD_END, LOAD_START

TITLE = "\x1b]0;owned\x07"  # sets the terminal's title
CLEAR = "\x1b[2J"  # clears the screen


class Busy(FakeRun):
    def __call__(self, case, budget):
        measurement = super().__call__(case, budget)
        measurement.metadata.update({LOAD_START: 1.8, LOAD_END: 1.8})
        return measurement


def test_the_remeasure_command_runs_the_suite_file_it_names_and_nothing_else(cli, tmp_path):
    cli.fake = Busy()
    suite = tiny_suite(tmp_path, file="x; touch PWNED; #")
    out = tmp_path / "results $(touch PWNED2)"
    assert cli("run", suite, "--out", out, "-q", "--set", "seq_len=16,32").code == 0
    shown = cli("show", out)
    line = next(line for line in shown.err.splitlines() if "topk-bench run " in line)
    command = line[line.index("topk-bench run ") :].split(" (marked")[0]
    # What a shell makes of the pasted command: the words topk-bench would get, and nothing run.
    words = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + command.removeprefix("topk-bench ")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout.splitlines()
    assert words == ["run", str(suite), "--out", str(out), "--set", "seq_len=16,32", "--remeasure", "busy,noisy"], (
        command
    )
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()
    assert shlex.split(command)[2] == str(suite)


def test_an_error_line_shows_a_file_names_escape_sequences_as_text(cli, tmp_path):
    missing = tmp_path / f"results{TITLE}{CLEAR}.csv"
    missing.write_text("not,a,results,file\n")
    result = cli("show", missing)
    line = result.error_line
    assert result.code == 2 and "\x1b" not in result.err and "\x07" not in result.err
    assert "results\\x1b]0;owned\\x07\\x1b[2J.csv" in line, line


def test_case_echoes_its_value_as_text(cli, tmp_path):
    suite = tiny_suite(tmp_path)
    result = cli("profile", suite, "--case", f"seq_len={CLEAR}", "--out", tmp_path / "profiles")
    assert result.code == 2 and "\x1b" not in result.err
    assert "\\x1b[2J" in result.error_line, result.err


def test_an_option_of_the_wrong_type_is_one_line_not_a_usage_block(cli, tmp_path):
    result = cli("run", tiny_suite(tmp_path), "--rounds", "abc")
    assert result.code == 2 and "Invalid value for '--rounds'" in result.error_line, result.err
    assert result.error_line.endswith("(see topk-bench run --help)")
    unknown = cli("show", tmp_path, f"--wid{CLEAR}")
    assert unknown.code == 2 and "\x1b" not in unknown.err and "No such option" in unknown.error_line
