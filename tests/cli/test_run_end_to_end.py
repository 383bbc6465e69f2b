"""`topk-bench run` and `show` end to end through the real measurement core (tiny cases, one child each)."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner_fakes import interruptible

SUITE = """
name = "tiny"
workload = "mha"
causal = true
repeats = 1
warmup = 0
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [8, 16, 32, 64, 128, 256, 512, 1024]
[[impl]]
name = "qchunk"
chunk_size = 4
"""
CASES = 8  # enough left after the first that a starved test process still interrupts the run mid-way


def cli(*args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "topk_bench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
        **kwargs,
    )


def rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(path, newline=""))) if path.exists() else []


def workers_of(pid: int) -> list[int]:
    """Live worker processes started by ``pid`` (the launcher passes ``--parent-pid``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"topk_bench.child.worker" in args and str(pid).encode() in args:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_run_interrupted_by_sigint_then_resumed_then_shown(tmp_path):
    suite, out = tmp_path / "tiny.toml", tmp_path / "out"
    suite.write_text(SUITE)
    csv_path = out / "tiny.csv"
    proc = cli("run", str(suite), "--out", str(out), "--device", "cpu")
    deadline = time.monotonic() + 120
    while len(rows(csv_path)) < 1:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    while not workers_of(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # interrupt while the next case's child is alive
    assert proc.poll() is None, "the run ended before the test could interrupt it"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    kept = rows(csv_path)
    assert 1 <= len(kept) < CASES and all(r["status"] == "ok" for r in kept)
    # No measuring child outlives the run (one still importing torch exits as soon as it sees its parent gone).
    deadline = time.monotonic() + 60
    while workers_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers_of(proc.pid) == []

    again = cli("run", str(suite), "--out", str(out), "--device", "cpu")
    stdout, err = again.communicate(timeout=180)
    assert again.returncode == 0, err
    final = rows(csv_path)
    assert len(final) == CASES and len({r["case_id"] for r in final}) == CASES and final[: len(kept)] == kept
    assert {r["status"] for r in final} == {"ok"} and all(int(r["peak_bytes"]) > 0 for r in final)
    assert "results:" in stdout and "tiny.csv" in stdout.replace("\n", "")

    shown = subprocess.run(
        [sys.executable, "-m", "topk_bench", "show", str(out), "--wide"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert f"tiny ({CASES} rows)" in shown.stdout and "peak GiB" in shown.stdout and "Q-chunking" in shown.stdout


@pytest.mark.slow
def test_help_of_run_and_show():
    for command in ("run", "show"):
        result = subprocess.run([sys.executable, "-m", "topk_bench", command, "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and "Usage" in result.stdout
    result = subprocess.run([sys.executable, "-m", "topk_bench", "run", "--help"], capture_output=True, text=True)
    for flag in (
        "--out",
        "--device",
        "--predict",
        "--repeats",
        "--warmup",
        "--max-memory",
        "--max-case-seconds",
        "--no-resume",
        "--executor",
        "--jobs",
        "--config",
    ):
        assert flag in result.stdout


@pytest.mark.slow
def test_show_of_a_missing_path_is_bad_input(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "topk_bench", "show", str(tmp_path / "none")], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stderr.strip().endswith("no such file or directory")
