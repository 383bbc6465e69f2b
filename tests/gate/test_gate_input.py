"""``topk-bench gate``'s bad input and its own faults, before anything is measured: one line on stderr, exit 2,
nothing measured or left behind (fast: the command in this process)."""

from __future__ import annotations

import subprocess

import pytest

from locations import ROOT
from topk_bench.cli import main
from topk_bench.errors import BadInput
from topk_bench.gate import worktree

A_TYPO = """
name = "typo"
workload = "decode"
[shape]
model = "llama-3-8b"
kv_len = 256
[sweep]
batch = [1]
[[impl]]
name = "topk_fast"
topk_size = 16
"""


def gate(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(["gate", *map(str, args)])
    out = capsys.readouterr()
    return int(ended.value.code), out.out, out.err


def one_line(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("topk-bench: error: "), (out, err)
    return err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--base", "no-such-revision"], "--base: 'no-such-revision' is not a commit of this repository"),
        (["--rounds", "3"], "--rounds: expected an even number >= 4, got 3"),
        (["--rounds", "8", "--max-rounds", "4"], "--max-rounds: expected at least --rounds (8), got 4"),
        (["--time-factor", "0.9"], "--time-factor: expected a factor between 1 and 10"),
        (["--block-timeout", "0"], "--block-timeout: expected seconds > 0"),
        (["--suite", "/nonexistent.toml"], "/nonexistent.toml: no such suite file"),
        (["--judge", "/nonexistent.csv", "/nonexistent.csv"], "/nonexistent.csv: no such CSV, nor a folder"),
        (["--kind", "avx2"], "No such option: --kind"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(capsys, monkeypatch, args, words):
    monkeypatch.chdir(ROOT)
    assert words in one_line(*gate(capsys, *args))


def test_an_output_that_is_a_file_or_holds_files_is_refused_before_measuring(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    (tmp_path / "file").write_text("x")
    err = one_line(*gate(capsys, "--out", tmp_path / "file"))
    assert "file: is a file: the gate measures into a new directory" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.csv").write_text("x")
    assert "is not empty" in one_line(*gate(capsys, "--out", tmp_path / "full"))
    assert (tmp_path / "full" / "kept.csv").read_text() == "x"


def test_a_suite_that_does_not_read_is_refused_naming_it_before_anything_runs(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    (tmp_path / "suite.toml").write_text(A_TYPO)
    err = one_line(*gate(capsys, "--suite", tmp_path / "suite.toml", "--out", tmp_path / "out"))
    assert "suite.toml" in err and "topk_size" in err
    assert not (tmp_path / "out").exists()


def test_without_git_or_outside_a_repository_it_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert "is not inside a git repository" in one_line(*gate(capsys))
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PATH", str(tmp_path))  # no git there
    assert "git is not on PATH" in one_line(*gate(capsys))


def test_the_base_file_names_a_commit_and_a_bad_file_is_bad_input(tmp_path):
    named = (ROOT / "baselines" / "time-gate-base").read_text().split()[0]
    assert len(named) == 40 and worktree.base_revision(ROOT, None, ROOT / "baselines" / "time-gate-base") == named
    for body in ("", "0123456789abcdef0123456789abcdef01234567\n"):
        (tmp_path / "base").write_text(body)
        with pytest.raises(BadInput, match="is not a commit of this repository"):
            worktree.base_revision(ROOT, None, tmp_path / "base")
    (tmp_path / "base").unlink()
    with pytest.raises(BadInput, match="cannot read it"):
        worktree.base_revision(ROOT, None, tmp_path / "base")


def test_a_worktree_left_by_a_killed_gate_is_removed_by_the_next_and_a_live_ones_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(worktree.tempfile, "tempdir", None)  # mkdtemp reads TMPDIR afresh
    with worktree.checkout(ROOT, "HEAD") as live:
        with worktree.checkout(ROOT, "HEAD") as left:
            (left.parent / worktree.OWNER).write_text("999999999\n")  # its gate killed outright: no such process
            removed = worktree.remove_stale(ROOT)
            assert removed == [left] and not left.parent.exists() and live.exists()
        listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
        assert str(left) not in listed and str(live) in listed
    assert not live.parent.exists()
