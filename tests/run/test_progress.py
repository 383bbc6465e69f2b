"""What a run shows while it goes: an ETA that keeps moving during a long case; --jobs auto."""

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


def test_eta_counts_down_through_a_case_then_grows_while_it_overruns():
    clock = Clock()
    eta = Eta(clock)
    assert eta.seconds_left(5) is None  # nothing ran yet
    clock.now += 10
    eta.ended()
    clock.now += 10
    eta.ended()  # 2 cases in 20 s: 10 s a case
    assert eta.seconds_left(4) == pytest.approx(40)
    clock.now += 4  # the running case is 4 s in: 6 s of it left, then 3 more cases
    assert eta.seconds_left(4) == pytest.approx(36)
    clock.now += 6  # it took its average
    assert eta.seconds_left(4) == pytest.approx(30)
    clock.now += 20  # 30 s in: if it ended now, 3 cases of (20 + 30) / 3 s would be left
    assert eta.seconds_left(4) == pytest.approx(50)
    assert eta.seconds_left(0) == 0


def test_eta_ignores_rows_written_without_running():
    clock = Clock()
    eta = Eta(clock)
    clock.now += 10
    eta.ended()
    eta.ended(ran=False)  # skipped at once: says nothing of how long a case takes
    assert eta.seconds_left(2) == pytest.approx(20)


def test_the_progress_bar_shows_the_moving_eta_and_elsewhere_one_line_per_case():
    clock = Clock()
    buffer = io.StringIO()
    with Reporter("mha", total=3, done=0, console=Console(file=buffer, force_terminal=True, width=150)) as reporter:
        reporter.eta = Eta(clock)
        clock.now += 60
        reporter.finished("Top-k seq_len=1024", {"status": "ok", "peak_bytes": 2**30, "time_median_s": 0.5})
        clock.now += 15
        reporter._progress.refresh()
    assert "0:01:45" in buffer.getvalue()  # 2 x 60 s - 15 s
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


def test_the_estimate_is_at_most_the_budgets_about_what_cases_took_before_and_nothing_when_nothing_runs(tmp_path):
    import csv

    from runner_fakes import FakeRun
    from topk_bench.run import runner
    from topk_bench.run.executors import LocalExecutor

    suite = write_suite(tmp_path)
    the_plan = planning.plan(suite, Flags(device="cpu", out=tmp_path / "out"))
    n = len(the_plan.cases)
    assert planning.size_note(the_plan, n) == (
        f"{n} cases to run (0 already in fake.csv), estimate at most "
        f"{planning.format_duration(3 + n * 60.25)} (1 at a time, each "
        "within its 60 s time budget)"
    )
    runner.run(
        suite, Flags(out=tmp_path / "out", device="cpu"), progress=False, executor_obj=LocalExecutor(run=FakeRun())
    )
    assert planning.size_note(the_plan, 0) == f"nothing to run: all {n} cases are in fake.csv"
    # Rows written 10 s apart: a case took 10 s here; the rest are about that each, never more than the budget.
    path = tmp_path / "out" / "fake.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        row["timestamp"] = f"2026-11-24T10:{10 * i // 60:02d}:{10 * i % 60:02d}+00:00"
    rows[0]["timestamp"] = "not a time"  # a hand-edited cell is left out, never a traceback
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    assert planning.seconds_per_case(path) == 10.0
    note = planning.size_note(the_plan, 2)
    assert (
        f"2 cases to run ({n - 2} already in fake.csv), estimate about 23 s (10 s a case here before), at most" in note
    )


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
