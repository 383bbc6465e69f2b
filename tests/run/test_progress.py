"""What a run shows while it goes: the time left on the bar, one line per case elsewhere; --jobs auto.
(The estimate and the time left: tests/run/test_estimates.py.)"""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from runner_fakes import write_suite
from topk_bench.errors import BadInput
from topk_bench.run import plan as planning
from topk_bench.run.progress import Eta, Reporter
from topk_bench.run.resolve import Flags


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_progress_bar_shows_the_moving_eta_and_elsewhere_one_line_per_case():
    clock = Clock()
    buffer = io.StringIO()
    eta = Eta({"a": 30.0, "b": 30.0, "c": 30.0}, clock=clock)
    console = Console(file=buffer, force_terminal=True, width=150)
    with Reporter("mha", total=3, done=0, console=console, eta=eta) as reporter:
        clock.now += 60
        row = {"case_id": "a", "status": "ok", "peak_bytes": 2**30, "time_median_s": 0.5, "wall_s": 60.0}
        reporter.finished("Top-k seq_len=1024", row)
        clock.now += 15
        reporter._progress.refresh()
    assert "0:01:45" in buffer.getvalue()  # the two left: 2 x 30 s by the estimate, twice that here, less 15 s
    plain = io.StringIO()
    with Reporter("mha", total=2, done=0, console=Console(file=plain, force_terminal=False, width=150)) as reporter:
        reporter.finished("a", {"status": "ok"})
        reporter.finished("b", {"status": "skipped", "error": "skipped: a hit oom"})
    assert plain.getvalue().splitlines() == [
        "[1/2] a: ok  peak -  time -",
        "[2/2] b: skipped  peak -  time -  (skipped: a hit oom)",
    ]
    small = io.StringIO()
    with Reporter("mha", total=1, done=0, console=Console(file=small, force_terminal=False, width=150)) as reporter:
        reporter.finished("c", {"status": "ok", "peak_bytes": 12288, "time_median_s": 0.0493})
    assert small.getvalue().splitlines() == ["[1/1] c: ok  peak 12.0 KiB  time 49.3 ms"]  # not "0.000 GiB"


def test_jobs_auto_is_one_per_core_and_the_default_of_predict(tmp_path, monkeypatch):
    from topk_bench.run import resolve

    monkeypatch.setattr(resolve, "cores", lambda: 6)
    suite = write_suite(tmp_path)
    assert planning.plan(suite, Flags(device="cpu", jobs="auto")).executor.jobs == 6
    assert planning.plan(suite, Flags(device="cpu", jobs="3")).executor.jobs == 3
    assert planning.plan(suite, Flags(device="cpu")).executor.jobs == 1
    assert planning.plan(suite, Flags(predict=True)).executor.jobs == 6
    assert planning.plan(suite, Flags(predict=True, jobs=2)).executor.jobs == 2
    for bad in ("many", "0", 0):
        with pytest.raises(BadInput, match="--jobs"):
            planning.plan(suite, Flags(device="cpu", jobs=bad))


@pytest.mark.slow  # real CLI processes
def test_a_bad_jobs_flag_is_one_line_of_bad_input(tmp_path):
    suite = write_suite(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "topk_bench", "run", str(suite), "--jobs", "lots", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["topk-bench: error: --jobs: expected a number >= 1 or auto, got 'lots'"]
    assert not (tmp_path / "out").exists()
