"""The crossover length (topk_bench/report/crossover.py): hand-computed cases in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from topk_bench.report.crossover import Kind, bootstrap_interval, crossing, from_lengths


def test_a_symmetric_crossing_is_the_geometric_mean_of_its_two_lengths():
    # log r goes from ln 2 to -ln 2: it reaches 0 half-way between log 1024 and log 2048
    found = crossing([512, 1024, 2048], [4.0, 2.0, 0.5])
    assert found.kind is Kind.FROM
    assert found.at == pytest.approx(1024 * math.sqrt(2), rel=1e-12)
    assert found.basis == "interpolated in log-log between 1024 and 2048"


def test_an_asymmetric_crossing_is_where_the_log_log_line_reaches_one():
    # log r: ln 2 at 1000, -2 ln 2 at 8000: a third of the way, 1000 * 8 ** (1 / 3) = 2000
    assert crossing([1000, 8000], [2.0, 0.25]).at == pytest.approx(2000.0, rel=1e-12)


def test_the_last_crossing_is_the_one_from_which_it_wins():
    found = crossing([1, 2, 4], [0.5, 2.0, 0.5])
    assert found.kind is Kind.FROM
    assert found.at == pytest.approx(2 * math.sqrt(2), rel=1e-12)


def test_a_ratio_of_exactly_one_is_no_win():
    found = crossing([1, 2], [1.0, 0.5])
    assert found.kind is Kind.FROM and found.at == pytest.approx(1.0)


def test_winning_at_every_length_has_no_crossing():
    found = crossing([512, 1024], [0.5, 0.4])
    assert (found.kind, found.at) == (Kind.EVERYWHERE, None)
    assert found.basis == "wins at every length from 512 to 1024"


def test_never_winning_is_extrapolated_from_the_last_three_lengths():
    # r = 16 / x: 16, 8, 4, 2 at 1, 2, 4, 8; the line through the last three reaches 1 at 16 (the first is left out)
    found = crossing([1, 2, 4, 8], [100.0, 8.0, 4.0, 2.0])
    assert found.kind is Kind.NOWHERE
    assert found.at == pytest.approx(16.0, rel=1e-12)
    assert found.basis == "extrapolated from a log-log line through the ratios at 2, 4, 8, slope -1.00"


def test_a_ratio_that_grows_with_length_is_never_extrapolated_to_a_win():
    found = crossing([1, 2, 4], [2.0, 3.0, 4.0])
    assert (found.kind, found.at) == (Kind.NOWHERE, None)
    assert found.basis.startswith("the ratio does not fall with length")


def test_an_extrapolation_past_a_thousand_times_the_range_is_not_given():
    # r = 2 * x ** -0.05: it reaches 1 at 2 ** 20 * 8 = 8.4e6, more than 1000 x the largest length (8)
    found = crossing([2, 4, 8], [2 * x**-0.05 for x in (2, 4, 8)])
    assert (found.kind, found.at) == (Kind.NOWHERE, None)
    assert found.basis.startswith("the ratio falls too slowly to extrapolate")


def test_winning_at_short_lengths_only_is_up_to():
    found = crossing([100, 400], [0.5, 2.0])
    assert found.kind is Kind.UP_TO
    assert found.at == pytest.approx(200.0, rel=1e-12)


def test_where_the_baseline_stopped_the_crossing_is_that_length():
    found = crossing([1024, 2048], [2.0, 0.0])
    assert (found.kind, found.at) == (Kind.FROM, 2048.0)
    assert found.basis == "the baseline stopped at 2048: no ratio there to interpolate"


def test_where_the_method_stopped_it_loses():
    found = crossing([1024, 2048], [0.5, math.inf])
    assert (found.kind, found.at) == (Kind.UP_TO, 2048.0)
    assert found.basis == "the method stopped at 2048: no ratio there to interpolate"


def test_no_common_length_is_no_data():
    assert crossing([], []).kind is Kind.NO_DATA


def test_the_vectorised_lengths_agree_with_crossing():
    rng = np.random.default_rng(1)
    xs = [256.0, 512.0, 1024.0, 4096.0, 8192.0]
    ratios = np.exp(rng.normal(0, 0.8, size=(400, len(xs))))
    ratios[::17, 2] = 0.0  # the baseline stopped there
    ratios[::23, 1] = np.inf  # the method stopped there
    got = from_lengths(xs, ratios)
    for row, value in zip(ratios, got):
        found = crossing(xs, list(row))
        expected = {Kind.FROM: found.at, Kind.EVERYWHERE: xs[0]}.get(found.kind, math.inf)
        assert value == pytest.approx(expected, rel=1e-12)


def test_samples_without_spread_give_the_point_itself():
    lengths = [([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]), ([0.5, 0.5], [1.0, 1.0, 1.0])]
    low, high = bootstrap_interval([1024, 2048], lengths, resamples=200)
    assert low == pytest.approx(1024 * math.sqrt(2), rel=1e-12)
    assert high == pytest.approx(1024 * math.sqrt(2), rel=1e-12)


def test_noisy_samples_give_an_interval_around_the_point_and_the_same_one_again():
    rng = np.random.default_rng(0)
    lengths = [
        (list(2.0 * rng.lognormal(0, 0.1, 9)), list(rng.lognormal(0, 0.1, 9))),
        (list(0.5 * rng.lognormal(0, 0.1, 9)), list(rng.lognormal(0, 0.1, 9))),
    ]
    point = crossing([1024, 2048], [float(np.median(m) / np.median(b)) for m, b in lengths]).at
    low, high = bootstrap_interval([1024, 2048], lengths)
    assert 1024 < low < point < high < 2048
    assert bootstrap_interval([1024, 2048], lengths) == (low, high)


def test_a_bootstrap_that_always_wins_or_never_wins_is_censored_at_the_range():
    win = [([0.5, 0.6], [1.0, 1.1]), ([0.5, 0.6], [1.0, 1.1])]
    assert bootstrap_interval([10, 20], win, resamples=50) == (10.0, 10.0)
    lose = [([2.0, 2.1], [1.0, 1.1]), ([2.0, 2.1], [1.0, 1.1])]
    assert bootstrap_interval([10, 20], lose, resamples=50) == (math.inf, math.inf)


def test_a_stopped_side_is_a_fixed_ratio_in_every_resample():
    assert bootstrap_interval([10, 20], [([2.0, 2.0], [1.0, 1.0]), 0.0], resamples=50) == (20.0, 20.0)


def test_drawing_only_the_lengths_that_can_move_it_gives_the_interval_of_drawing_them_all():
    rng = np.random.default_rng(3)
    xs = [float(2**i) for i in range(4, 16)]
    for trial in range(20):
        # a method that loses below ~2**9 and wins above, the samples spread enough to blur a few lengths
        truth = [(x / 2**9) ** -0.5 for x in xs]
        lengths = [(list(t * rng.lognormal(0, 0.15, 5)), list(rng.lognormal(0, 0.15, 5))) for t in truth]
        if trial % 4 == 0:
            lengths[-1] = 0.0  # the baseline stopped at the longest
        fast = bootstrap_interval(xs, lengths, resamples=300, seed=trial)
        every = bootstrap_interval(xs, lengths, resamples=300, seed=trial, every_length=True)
        assert fast == every
