"""``topk-bench gate`` measuring for real (slow): a tiny suite, this repository's HEAD as BASE in a temporary
worktree, and the gate's faults injected on purpose in scratch clones of the repository: a hanging BASE, a NEW
that does not compile, a termination in the middle. Each ends with the gate's own line, no traceback, no worktree
left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from locations import ROOT

pytestmark = pytest.mark.slow

TINY = """
name = "tiny_time"
workload = "decode"
dtype = "float32"
repeats = 5
warmup = 1
threads = 1
timer = "process_time"
min_sample_s = 0.02
[shape]
model = "llama-3-8b"
kv_len = 4096
new_tokens = 1
[sweep]
batch = [1]
[[impl]]
name = "topk_fast"
topk = 256
"""


def gate(
    *args, cwd: Path, tree: Path = ROOT, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``topk-bench gate`` run by ``tree``'s code in ``cwd`` (its temporary folders in ``env``'s TMPDIR)."""
    environment = {"PATH": os.environ["PATH"], "COLUMNS": "200", "PYTHONPATH": str(tree), **(env or {})}
    command = [sys.executable, "-m", "topk_bench", "gate", *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=environment)


def worktrees(repository: Path) -> list[str]:
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=repository, capture_output=True, text=True)
    return [line.split(" ", 1)[1] for line in listed.stdout.splitlines() if line.startswith("worktree ")]


def left_behind(repository: Path, tmp: Path) -> list[str]:
    """This test's base worktrees still listed or on disk (the repository's other worktrees may come and go)."""
    listed = [t for t in worktrees(repository) if t.startswith(tmp.as_posix())]
    return listed + [str(p) for p in tmp.glob("topk-bench-time-gate-base-*")]


@pytest.fixture
def scratch(tmp_path) -> tuple[Path, Path, Path]:
    """(a clone of this repository sharing its objects, the tiny suite, a TMPDIR for the gate)."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--shared", str(ROOT), str(clone)], check=True)
    for key, value in (("user.email", "t@example.com"), ("user.name", "t")):
        subprocess.run(["git", "config", key, value], cwd=clone, check=True)
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "tmp").mkdir()
    return clone, tmp_path / "tiny.toml", tmp_path / "tmp"


def commit_on_a_branch(clone: Path, branch: str, path: str, text: str) -> None:
    """A commit on ``branch`` that writes ``text`` into ``path``, the clone left on its own branch."""
    subprocess.run(["git", "checkout", "--quiet", "-b", branch], cwd=clone, check=True)
    (clone / path).write_text(text)
    subprocess.run(["git", "commit", "--quiet", "-am", branch], cwd=clone, check=True)
    subprocess.run(["git", "checkout", "--quiet", "-"], cwd=clone, check=True)


def test_a_slowed_method_regresses_and_the_blocks_and_verdict_are_kept_under_a_relative_out(tmp_path):
    # HEAD's code in a temporary worktree against this checkout's, topk_fast slowed 3x in this checkout only; the
    # gate started in a subdirectory with a relative --out.
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "tmp").mkdir()
    out = os.path.relpath(tmp_path / "out", ROOT / "docs")
    env = {"TOPK_BENCH_TEST_SLOWDOWN": "topk_fast=3", "TMPDIR": str(tmp_path / "tmp")}
    done = gate("--suite", tmp_path / "tiny.toml", "--base", "HEAD", "--out", out, "--rounds", "4", cwd=ROOT / "docs",
                env=env)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()
    assert any("FAILED: 1 regressed, in 4 rounds a side" in line for line in last), done.stdout
    assert any(line.startswith("  decode/Top-k fast (topk=256): regressed beyond x1.2: x") for line in last)
    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert verdict["passed"] is False and verdict["base"] == head and verdict["rounds"] == {"BASE": 4, "NEW": 4}
    (case,) = verdict["cases"]
    assert case["verdict"] == "regressed" and 2.0 < case["estimate"] < 4.5 and len(case["new_s"]) == 4
    # Two blocks a side, BASE's rows naming the base commit; NEW's topk_fast slowed, not BASE's.
    base = pd.concat([pd.read_csv(p) for p in sorted((tmp_path / "out" / "BASE").glob("*/*.csv"))])
    assert len(base) == 2 and {s.removesuffix("-dirty") for s in base.git_sha} == {head}
    assert set(base.timer) == {"process_time"} and (base.loops >= 1).all()
    assert not left_behind(ROOT, tmp_path / "tmp")


def test_a_base_that_hangs_is_killed_at_the_block_timeout_with_its_cases(scratch):
    clone, suite, tmp = scratch
    commit_on_a_branch(clone, "hangs", "topk_bench/__main__.py", "import time\ntime.sleep(3600)\n")
    started = time.monotonic()
    done = gate("--suite", suite, "--base", "hangs", "--block-timeout", "20", cwd=clone, tree=clone,
                env={"TMPDIR": str(tmp)})  # fmt: skip
    assert done.returncode == 1 and time.monotonic() - started < 120, done.stdout + done.stderr
    assert "FAILED: BASE's run did not end in 20 s (--block-timeout): killed with its cases" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr and not left_behind(clone, tmp)
    sleepers = subprocess.run(["pgrep", "-f", f"{suite}"], capture_output=True, text=True).stdout.split()
    assert not sleepers  # the hung run and anything it started are gone


def test_a_new_that_does_not_compile_fails_with_one_line(scratch):
    clone, suite, tmp = scratch
    with open(clone / "topk_bench" / "attention" / "methods" / "sdpa.py", "a") as f:
        f.write("\ndef broken(:\n")
    done = gate("--suite", suite, "--base", "HEAD", cwd=clone, tree=clone, env={"TMPDIR": str(tmp)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr and done.stderr == ""
    last = done.stdout.strip().splitlines()[-1]
    assert "FAILED:" in last and "SyntaxError" in last and "sdpa.py" in last, done.stdout
    assert not left_behind(clone, tmp)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_gate_removes_its_worktree(scratch, sig):
    clone, suite, tmp = scratch
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": str(clone), "TMPDIR": str(tmp)}
    command = [sys.executable, "-m", "topk_bench", "gate", "--suite", str(suite), "--base", "HEAD"]
    process = subprocess.Popen(command, cwd=clone, env=environment, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not [t for t in worktrees(clone) if t.startswith(tmp.as_posix())] and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # into BASE's first block
    process.send_signal(sig)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + sig, out
    assert f"terminated by signal {sig.name}: the base worktree was removed" in out
    assert not left_behind(clone, tmp)
