"""Steps in a series over commits (topk_bench/report/steps.py): hand-computed cases."""

from __future__ import annotations

import pytest

from topk_bench.report.steps import steps


def test_a_level_that_moves_by_1_3_and_stays_is_one_step_at_the_commit_that_moved_it():
    found = steps([10.0, 10.2, 9.9, 13.0, 13.1, 12.9])
    assert [s.index for s in found] == [3]
    # after: median(13.0, 13.1, 12.9) = 13.0; before: median(10.0, 10.2, 9.9) = 10.0
    assert found[0].ratio == pytest.approx(1.3, rel=1e-12)
    assert found[0].up


def test_a_step_down_is_a_step_too():
    found = steps([20.0, 20.0, 10.0, 10.0])
    assert [(s.index, s.up) for s in found] == [(2, False)]
    assert found[0].ratio == pytest.approx(0.5)


def test_one_noisy_commit_within_the_factor_is_no_step():
    assert steps([10.0, 10.5, 9.6, 10.4, 10.0]) == []


def test_one_outlier_is_no_step():
    # segmentation splits at the outlier (up) and after it (down): one commit off its level, not two steps
    assert steps([10.0, 10.0, 10.0, 20.0, 10.0, 10.0]) == []


def test_a_step_blurred_by_noise_is_placed_where_the_levels_split_best():
    # the planted x1.3 of the history demo (docs/report.md): the fourth commit's value alone is only x1.2 over
    # the level before, the segments' levels differ by median(0.122, 0.156, 0.131) / median(0.111, 0.089, 0.101)
    found = steps([0.111, 0.089, 0.101, 0.122, 0.156, 0.131])
    assert [s.index for s in found] == [3]
    assert found[0].ratio == pytest.approx(0.131 / 0.101, rel=1e-12)


def test_the_newest_commit_is_judged_on_its_own_value():
    found = steps([10.0, 10.0, 10.0, 13.0])
    assert [s.index for s in found] == [3]
    assert found[0].ratio == pytest.approx(1.3)


def test_commits_without_a_value_are_passed_over():
    found = steps([10.0, None, 10.0, 13.0, None, 13.0])
    assert [s.index for s in found] == [3]


def test_two_steps_the_same_way_apart_are_two_steps():
    found = steps([10.0, 10.0, 10.0, 20.0, 20.0, 20.0, 40.0, 40.0, 40.0])
    assert [s.index for s in found] == [3, 6]


def test_the_factor_is_the_threshold():
    assert steps([10.0, 10.0, 11.0, 11.0], factor=1.05)[0].index == 2
    assert steps([10.0, 10.0, 11.0, 11.0], factor=1.15) == []
    assert steps([10.0, 10.0, 11.9, 11.9]) == []  # x1.19: within the default 1.2
