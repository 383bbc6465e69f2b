"""``stats.ratio_interval``: the Hodges-Lehmann ratio of two samples and Moses' distribution-free interval, which
the time gate judges each case by. Checked against enumeration, the published critical values of the
Mann-Whitney test, and its coverage on simulated samples with a known ratio."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest

from topk_bench.report.stats import _u_counts, critical_count, ratio_interval


@pytest.mark.parametrize(("m", "n"), [(1, 1), (2, 3), (4, 4), (3, 6), (5, 5)])
def test_the_counts_of_u_are_those_of_every_split_enumerated(m, n):
    counts = [0] * (m * n + 1)
    for chosen in itertools.combinations(range(m + n), m):  # ranks of the first sample among m + n, no ties
        u = sum(1 for i in chosen for j in set(range(m + n)) - set(chosen) if i > j)
        counts[u] += 1
    assert list(_u_counts(m, n)) == counts and sum(counts) == math.comb(m + n, m)


# Two-sided alpha = 0.05 critical values of U (reject when U <= value), from the standard tables: k is one more.
@pytest.mark.parametrize(
    ("m", "n", "table"), [(4, 4, 0), (5, 5, 2), (6, 6, 5), (8, 8, 13), (10, 10, 23), (6, 9, 10), (16, 16, 75)]
)
def test_the_critical_count_is_the_tables(m, n, table):
    assert critical_count(m, n, 0.95) == table + 1


def test_too_few_values_give_no_interval():
    # 3 a side: the most extreme split has P = 2/20 > 0.05, so no order statistic bounds a 95% interval.
    shift = ratio_interval([1.0, 1.1, 0.9], [1.0, 1.2, 1.1])
    assert (shift.low, shift.high) == (0.0, math.inf) and shift.estimate > 0


def test_four_a_side_bound_the_ratio_by_the_extreme_pairs_and_estimate_by_their_median():
    base, new = [1.0, 1.1, 0.9, 1.05], [1.3, 1.2, 1.4, 1.25]
    ratios = sorted(b / a for a in base for b in new)
    shift = ratio_interval(base, new)
    assert shift.low == pytest.approx(ratios[0]) and shift.high == pytest.approx(ratios[-1])
    assert shift.estimate == pytest.approx(math.exp(statistics.median(math.log(r) for r in ratios)))


def test_the_interval_covers_the_true_ratio_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(1000):
        base = np.exp(rng.normal(0, 0.1, 8))
        new = 1.3 * np.exp(rng.normal(0, 0.1, 8))
        shift = ratio_interval(base.tolist(), new.tolist())
        covered += shift.low <= 1.3 <= shift.high
    # The exact interval covers at least 95% by construction (P(U < k) <= 2.5% each side), a little more at 8.
    assert 0.935 <= covered / 1000 <= 0.975


def test_a_large_sample_uses_the_normal_approximation_and_stays_near_the_exact():
    rng = np.random.default_rng(3)
    base, new = np.exp(rng.normal(0, 0.1, 70)).tolist(), np.exp(rng.normal(0.2, 0.1, 70)).tolist()
    shift = ratio_interval(base, new)
    assert shift.low < math.exp(0.2) < shift.high and shift.high / shift.low < 1.15


@pytest.mark.parametrize("bad", [[], [0.0, 1.0], [-1.0, 1.0], [math.nan, 1.0], [math.inf, 1.0]])
def test_values_that_are_not_positive_and_finite_are_refused(bad):
    with pytest.raises(ValueError, match="positive, finite"):
        ratio_interval(bad, [1.0, 1.0])
