"""A run's estimate is one a user can plan by: a typical time from the cost model (or from what the same cases took
here before), the bound its budgets set second; the progress bar's time left scales it by what the cases done
took."""

from __future__ import annotations

import dataclasses

import pytest

from runner_fakes import FakeRun, write_suite
from topk_bench.results import columns as col
from topk_bench.run import estimate
from topk_bench.run import plan as planning
from topk_bench.run.progress import Eta
from topk_bench.run.resolve import Flags
from topk_bench.suite.settings import ExecutorSettings

LOCAL = ExecutorSettings()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _cases(tmp_path, suite="suites/mha.toml", **flags):
    return planning.plan(suite, Flags(out=tmp_path, **flags), yes=True).cases


def test_a_case_costs_more_the_more_it_computes_and_a_prediction_less_than_a_measurement(tmp_path):
    measured = {(c.impl, c.param_dict["seq_len"]): c for c in _cases(tmp_path, device="cpu")}
    predicted = {(c.impl, c.param_dict["seq_len"]): c for c in _cases(tmp_path, predict=True)}
    seconds = estimate.case_seconds
    assert seconds(measured["vanilla", 512]) < seconds(measured["vanilla", 2048]) < seconds(measured["vanilla", 8192])
    # Attention's FLOPs grow as the square of the length: a measured 8K layer is a minute on a CPU thread.
    assert seconds(measured["vanilla", 8192]) > 15 * seconds(measured["vanilla", 1024])
    assert seconds(predicted["vanilla", 65536]) < 1 < seconds(measured["vanilla", 2048])
    # A prediction pays per op: a chunked method's 64 chunks, more than its one.
    assert seconds(predicted["topk", 65536]) > 5 * seconds(predicted["topk", 1024])
    # More threads, a shorter case.
    two = dataclasses.replace(measured["vanilla", 4096], threads=2)
    assert seconds(two) < seconds(dataclasses.replace(measured["vanilla", 4096], threads=1))


def test_the_run_is_its_cases_laid_out_on_its_job_slots():
    assert estimate.makespan([4, 1, 1, 1, 1], 1) == 8
    assert estimate.makespan([4, 1, 1, 1, 1], 2) == 4  # the long one on one slot, the rest on the other
    assert estimate.makespan([1, 1, 1, 4], 2) == 5  # it starts last, when a slot is free: it ends last


def test_cases_that_share_the_cores_take_longer_alike():
    two = ExecutorSettings(jobs=2)
    assert estimate.slowdown(two, 1, busy=0.0, cores=2) == 1.0
    assert estimate.slowdown(two, 1, busy=1.0, cores=2) == 1.5  # another process keeps a core busy
    assert estimate.slowdown(LOCAL, 4, busy=0.0, cores=2) == 2.0  # four threads on two cores
    assert estimate.slowdown(ExecutorSettings(kind="slurm"), 4, busy=2.0, cores=2) == 1.0  # a job has its own
    assert estimate.slowdown(LOCAL, 1, busy=None, cores=2) == 1.0  # /proc says nothing: as alone


def test_what_the_same_cases_took_here_before_is_what_they_are_expected_to_take(tmp_path):
    cases = _cases(tmp_path, predict=True)[:4]
    rows = [
        {col.CASE_ID: cases[0].case_id, col.WALL_S: "10.0", col.CPU_FLAGS: "none"},
        {col.CASE_ID: cases[0].case_id, col.WALL_S: "30.0", col.CPU_FLAGS: "none"},
        {col.CASE_ID: cases[1].case_id, col.WALL_S: "99.0", col.CPU_FLAGS: "avx512_bf16"},  # another machine's
        {col.CASE_ID: cases[2].case_id, col.WALL_S: ""},  # a row of a run before wall_s
    ]
    before = estimate.earlier(rows, {col.CPU_FLAGS: "none"})
    assert before == {cases[0].case_id: 20.0}
    guess = estimate.estimate(cases, LOCAL, 60.0, before=before)
    assert guess.per_case[cases[0].case_id] == 20.0 and guess.known == 1
    assert guess.per_case[cases[1].case_id] == estimate.case_seconds(cases[1])
    assert guess.typical_s == pytest.approx(estimate.INTERPRETER_S + sum(guess.per_case.values()))
    assert guess.text().startswith(f"about {estimate.format_duration(guess.typical_s)}, at most ")
    assert guess.text().endswith("; 1 of 4 case(s) as they took here before")


def test_the_first_line_gives_the_typical_time_then_the_bound_and_nothing_when_nothing_runs(tmp_path):
    from topk_bench.run import runner
    from topk_bench.run.executors import LocalExecutor

    suite = write_suite(tmp_path)
    the_plan = planning.plan(suite, Flags(device="cpu", out=tmp_path / "out"))
    n = len(the_plan.cases)
    line, guess = planning.size_note(the_plan, the_plan.cases, [])
    assert line == (
        f"{n} cases to run (0 already in fake.csv), estimate about {estimate.format_duration(guess.typical_s)}, "
        f"at most {estimate.format_duration(3 + n * 60.25)} (1 at a time, each within its 60 s time budget)"
    )
    assert guess.typical_s < guess.bound_s
    runner.run(
        suite, Flags(out=tmp_path / "out", device="cpu"), progress=False, executor_obj=LocalExecutor(run=FakeRun())
    )
    assert planning.size_note(the_plan, [], [])[0] == f"nothing to run: all {n} cases are in fake.csv"


def test_the_rows_say_what_each_case_took(tmp_path):
    """``wall_s``: the child's seconds, from the parent's clock (the launcher's ``child_wall_s``)."""
    from topk_bench.case import Measurement
    from topk_bench.results.row import make_row

    case = _cases(tmp_path, predict=True)[0]
    row = make_row(case, Measurement(status="ok", peak_bytes=1, metadata={"child_wall_s": 1.25}))
    assert row[col.WALL_S] == 1.25
    assert make_row(case, Measurement(status="skipped"))[col.WALL_S] is None


def test_the_time_left_is_the_estimate_scaled_by_what_the_cases_done_took():
    clock = Clock()
    eta = Eta({"a": 10.0, "b": 10.0, "c": 20.0, "d": 50.0}, clock=clock)
    assert eta.seconds_left() == pytest.approx(90)  # before any case: the estimate itself
    eta.ended("d", None, ran=False)  # skipped: costs nothing, and says nothing of the time a case takes
    assert eta.seconds_left() == pytest.approx(40) and eta.scale == 1.0
    clock.now += 20
    eta.ended("a", 20.0)  # it took twice what was expected: so will the others
    assert eta.seconds_left() == pytest.approx(60)
    clock.now += 15  # counting down through the next case
    assert eta.seconds_left() == pytest.approx(45)
    clock.now += 30  # past what is left if the largest case left ended now: held there
    assert eta.seconds_left() == pytest.approx(20)
    assert Eta().seconds_left() is None
    two = Eta({"a": 10.0, "b": 10.0}, slots=2, clock=clock)
    assert two.seconds_left() == pytest.approx(10)  # two slots share the work


def test_the_typical_time_never_exceeds_the_bound(tmp_path):
    cases = _cases(tmp_path, predict=True)[:3]
    before = {c.case_id: 1800.0 for c in cases}  # an earlier run measured them for 30 min each
    guess = estimate.estimate(cases, LOCAL, 60.0, before=before)  # now each is stopped at its 60 s budget
    assert guess.typical_s <= guess.bound_s, guess.text()
    assert guess.per_case == {c.case_id: 60.0 + estimate.FORK_S for c in cases}
    rounds = estimate.estimate(cases[:1], ExecutorSettings(jobs=2), 60.0, before=before, rounds=3)
    assert rounds.typical_s <= rounds.bound_s, rounds.text()  # three rounds of one case: one after another
