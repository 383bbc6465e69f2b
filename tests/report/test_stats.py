import math
import random

import pytest

from topk_bench.report.stats import (
    Verdict,
    classify_ratio,
    classify_samples,
    mann_whitney_p,
    min_p_value,
    min_samples_for,
    ratio,
)

ALPHA = 0.002
FACTOR = 1.10


def noisy(center, n, spread=0.05, seed=0):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_identical_samples_are_unchanged_with_p_one():
    samples = [0.010] * 10
    assert mann_whitney_p(samples, samples) == 1.0
    result = classify_samples("time_s", samples, samples, FACTOR, ALPHA)
    assert result.verdict is Verdict.UNCHANGED
    assert result.ratio == 1.0


def test_shifted_samples_are_a_regression_and_the_reverse_an_improvement():
    base, new = noisy(0.010, 10, seed=1), noisy(0.030, 10, seed=2)
    slower = classify_samples("time_s", base, new, FACTOR, ALPHA)
    assert slower.verdict is Verdict.REGRESSION
    assert slower.p_value < ALPHA and slower.ratio > 2.5
    faster = classify_samples("time_s", new, base, FACTOR, ALPHA)
    assert faster.verdict is Verdict.IMPROVEMENT


def test_small_shift_below_the_factor_is_unchanged_even_if_significant():
    base = noisy(0.010, 20, spread=0.001, seed=3)
    new = [t * 1.05 for t in base]
    assert mann_whitney_p(base, new) < ALPHA
    assert classify_samples("time_s", base, new, FACTOR, ALPHA).verdict is Verdict.UNCHANGED


def test_overlapping_noisy_samples_are_not_significant():
    # Medians 20% apart, but noise of +-60% mixes the samples: no evidence of a change.
    base = [0.010, 0.016, 0.006, 0.013, 0.008, 0.011, 0.015, 0.005, 0.009, 0.014]
    new = [0.012, 0.007, 0.018, 0.010, 0.016, 0.006, 0.013, 0.015, 0.009, 0.0145]
    result = classify_samples("time_s", base, new, FACTOR, ALPHA)
    assert result.ratio > FACTOR
    assert result.verdict is Verdict.UNCHANGED
    assert result.p_value >= ALPHA
    assert "not significant" in result.note


def test_too_few_samples_is_inconclusive_and_says_so():
    base, new = [0.010, 0.011, 0.010], [0.030, 0.031, 0.032]
    result = classify_samples("time_s", base, new, FACTOR, ALPHA)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.p_value is None and result.min_p_value >= ALPHA
    assert "too few samples" in result.note and "n=3/3" in result.note


def test_single_samples_are_inconclusive():
    result = classify_samples("time_s", [0.01], [0.05], FACTOR, ALPHA)
    assert result.verdict is Verdict.INCONCLUSIVE


def test_minimum_p_value_matches_the_exact_distribution():
    # Two-sided exact test, complete separation: 2 / C(n1 + n2, n1).
    for n1, n2 in [(3, 3), (6, 6), (7, 7), (5, 8)]:
        assert min_p_value(n1, n2) == pytest.approx(2 / math.comb(n1 + n2, n1))
    assert min_p_value(6, 6) > ALPHA > min_p_value(7, 7)
    assert min_samples_for(ALPHA) == 7
    assert min_samples_for(0.05) == 4
    assert min_p_value(0, 5) == 1.0


def test_ratio_rule_for_exact_memory():
    assert classify_ratio("peak_bytes", 1000, 1000, 1.001).verdict is Verdict.UNCHANGED
    assert classify_ratio("peak_bytes", 1000, 1001, 1.001).verdict is Verdict.UNCHANGED
    assert classify_ratio("peak_bytes", 1000, 1002, 1.001).verdict is Verdict.REGRESSION
    assert classify_ratio("peak_bytes", 1000, 900, 1.001).verdict is Verdict.IMPROVEMENT
    assert ratio(0, 0) == 1.0 and ratio(0, 5) == math.inf
    assert classify_ratio("peak_bytes", 0, 5, 1.001).verdict is Verdict.REGRESSION


def _enumerated_p(base, new):
    """The permutation test by brute force: every split of the pooled samples, midranks for ties."""
    import itertools

    from scipy.stats import rankdata

    ranks = rankdata([*base, *new])
    observed = sum(ranks[: len(base)])
    sums = [sum(ranks[i] for i in pick) for pick in itertools.combinations(range(len(ranks)), len(base))]
    low = sum(s <= observed + 1e-9 for s in sums) / len(sums)
    high = sum(s >= observed - 1e-9 for s in sums) / len(sums)
    return min(1.0, 2 * min(low, high))


def test_exact_p_with_ties_matches_enumerating_every_split():
    rng = random.Random(7)
    for _ in range(150):
        base = [rng.choice([1, 2, 3, 4]) / 1000 for _ in range(rng.randint(1, 6))]
        new = [rng.choice([2, 3, 4, 5]) / 1000 for _ in range(rng.randint(1, 6))]
        assert mann_whitney_p(base, new) == pytest.approx(_enumerated_p(base, new), abs=1e-12), (base, new)


def test_exact_p_without_ties_is_scipys_exact_p():
    from scipy.stats import mannwhitneyu

    rng = random.Random(8)
    for _ in range(50):
        base = [rng.random() for _ in range(rng.randint(1, 10))]
        new = [rng.random() + 0.2 for _ in range(rng.randint(1, 10))]
        assert mann_whitney_p(base, new) == pytest.approx(mannwhitneyu(base, new, method="exact").pvalue, abs=1e-12)


def test_exact_up_to_the_limit_then_the_normal_approximation_with_its_tie_correction():
    from scipy.stats import mannwhitneyu

    from topk_bench.report.stats import EXACT_MAX_SAMPLES

    half = EXACT_MAX_SAMPLES // 2
    base, new = noisy(0.010, half, seed=9), noisy(0.0103, half, seed=10)
    assert mann_whitney_p(base, new) == pytest.approx(mannwhitneyu(base, new, method="exact").pvalue, rel=1e-9)
    base = [round(t, 4) for t in noisy(0.010, half + 1, seed=9)]  # ties, one sample past the limit
    new = [round(t, 4) for t in noisy(0.0103, half + 1, seed=10)]
    assert len(set(base + new)) < len(base + new)
    assert mann_whitney_p(base, new) == pytest.approx(mannwhitneyu(base, new, method="asymptotic").pvalue, rel=1e-12)


def test_the_smallest_p_of_tied_values_matches_every_arrangement():
    """min_p_value of classify_samples: the most separated split of the pooled values, found by enumeration."""
    import itertools

    from topk_bench.report.stats import mann_whitney

    rng = random.Random(11)
    for _ in range(60):
        values = [rng.choice([1, 2, 3, 4, 5]) for _ in range(rng.randint(3, 9))]
        n = rng.randint(1, len(values) - 1)
        if len(set(values)) == 1:
            continue
        best = min(
            mann_whitney_p([values[i] for i in pick], [values[i] for i in range(len(values)) if i not in pick])
            for pick in itertools.combinations(range(len(values)), n)
        )
        assert mann_whitney(values[:n], values[n:])[1] == pytest.approx(best, abs=1e-12), (values, n)
