"""Pure statistics for ``compare``: is one metric of one case a regression, an improvement, or neither?

The time rule is asv's (``asv/_stats.py``, ``asv compare``): a change counts only
when the median ratio exceeds a factor *and* a Mann-Whitney U test on the raw
samples rejects "same distribution" at ``alpha``. The test is two-sided because
the direction is read from the data (the ratio): a one-sided test in the
direction the data point to would double the false-positive rate.

Its p-value is exact for the sample sizes a benchmark has, ties included (timers
have a resolution, and fast kernels tie): the rank sum's distribution over every
split of the pooled samples, counted by dynamic programming rather than
enumerated (what ``scipy.stats.mannwhitneyu(method=PermutationMethod())`` would
enumerate; scipy's own "exact" method ignores ties, and its normal approximation
misses alpha near the smallest p). When those values cannot give a p below
alpha in any arrangement, the verdict is ``inconclusive``, never ``unchanged``.

A sample or a value that is not a finite number >= 0 is judged ``invalid``
(a NaN compares false with everything and would pass any threshold).

Memory is compared by ratio alone: peaks from the ``cpu`` and ``predict``
backends are exact (no noise), so any growth beyond the factor is real.

No I/O, no pandas: everything here takes numbers and returns numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache

import numpy as np
from scipy.stats import mannwhitneyu

# Pooled samples up to which p is exact (50 a side: under 0.1 s on a loaded core). Beyond, scipy's
# normal approximation with its tie correction, a little conservative near alpha (p 10-40% too large at
# 30 a side, less with more samples).
EXACT_MAX_SAMPLES = 100


class Verdict(str, Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    UNCHANGED = "unchanged"
    # The ratio moved beyond the factor but the samples are too few (or too tied) for
    # the test to ever reach alpha: neither flagged nor silently passed.
    INCONCLUSIVE = "inconclusive"
    # A value is not a finite number >= 0 (NaN, inf, negative): nothing can be judged, and the gate fails.
    INVALID = "invalid"


@dataclass(frozen=True)
class MetricResult:
    """Outcome of one metric (``peak_bytes``, ``time_s``...) of one case."""

    metric: str
    base: float | None
    new: float | None
    ratio: float | None  # new / base; inf when base is 0 and new is not
    verdict: Verdict
    p_value: float | None = None
    min_p_value: float | None = None
    note: str = ""


def ratio(base: float, new: float) -> float:
    """``new / base``, with 0/0 = 1 (both empty) and x/0 = inf (grew from nothing)."""
    if base == 0:
        return 1.0 if new == 0 else math.inf
    return new / base


def median_ratio(base: Sequence[float], new: Sequence[float]) -> float:
    return ratio(statistics.median(base), statistics.median(new))


def _valid(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) and v >= 0 for v in values)


def _exact(base: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    """(p, smallest p any arrangement of these values gives): the exact two-sided test, ties included.

    The rank sum S of ``base`` (midranks, doubled to be integers) over all
    C(N, n) ways to pick n of the N pooled samples. ``ways[k, s]`` counts the
    picks of k samples summing to s, built up one group of tied values at a
    time; only sums up to the observed one are needed (ranks are positive), so
    the count runs from the end of the distribution nearer to it.
    """
    if len(base) > len(new):  # the same test from the smaller side: a smaller table
        return _exact(new, base)
    n, pooled = len(base), len(base) + len(new)
    ranks = np.array(_doubled_midranks([*base, *new]), dtype=np.int64)
    total = math.comb(pooled, n)
    observed = int(ranks[:n].sum())
    if observed > n * (pooled + 1):  # above the mean: reflect, and count the upper tail as a lower one
        ranks, observed = 2 * (pooled + 1) - ranks, 2 * n * (pooled + 1) - observed
    lowest = int(ranks.min())
    target = observed - n * lowest  # with every rank shifted down by the lowest, so sums start at 0
    ways = np.zeros((n + 1, target + 1))
    ways[0, 0] = 1.0
    values, counts = np.unique(ranks - lowest, return_counts=True)
    for r, m in zip(values.tolist(), counts.tolist()):
        if r > target:  # ranks only grow from here: no pick within the target takes these
            break
        if m == 1:  # numpy reads the right-hand side as it was before the add, overlapping or not
            ways[1:, r:] += ways[:n, : target + 1 - r]
            continue
        grown = ways.copy()
        for j in range(1, min(m, n) + 1):  # take j of the m tied samples
            if j * r > target:
                break
            grown[j:, j * r :] += math.comb(m, j) * ways[: n + 1 - j, : target + 1 - j * r]
        ways = grown
    at_most = ways[n].sum()
    below = at_most - ways[n, target]
    p = 2 * min(at_most / total, 1 - below / total)
    return min(1.0, float(p)), _floor(ranks, n, total)


def _doubled_midranks(values: Sequence[float]) -> list[int]:
    """Twice each value's midrank (ties share the mean of their ranks: integers when doubled): scipy's
    ``rankdata`` without its per-call cost (a millisecond, most of a compare of 100,000 cases)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    doubled = [0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            doubled[i] = start + end + 2  # 2 x the mean of ranks start+1 .. end+1
        start = end + 1
    return doubled


def smallest_p(base: Sequence[float], new: Sequence[float]) -> float:
    """The smallest two-sided p any split of these pooled values gives (:func:`mann_whitney`'s second number),
    without computing the p of this split: without ties, :func:`min_p_value` of the sizes (cached)."""
    pooled = [*base, *new]
    if len(set(pooled)) == 1:
        return 1.0
    if len(set(pooled)) == len(pooled):
        return min_p_value(len(base), len(new))
    return mann_whitney(base, new)[1]


def _floor(ranks: np.ndarray, n: int, total: int) -> float:
    """The smallest two-sided p of any split: the n smallest (or largest) ranks on one side.

    Only the tied group at the boundary can be split several ways: C(m, j) picks of j among its m.
    """
    ordered = np.sort(ranks)

    def picks(chosen: np.ndarray, edge: int) -> int:
        return math.comb(int((ordered == edge).sum()), int((chosen == edge).sum()))

    smallest, largest = ordered[:n], ordered[-n:]
    return min(1.0, 2 * min(picks(smallest, smallest[-1]), picks(largest, largest[0])) / total)


def _asymptotic(base: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    def p(x, y) -> float:
        return float(mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").pvalue)

    pooled, n = sorted([*base, *new]), len(base)
    return p(base, new), min(p(pooled[:n], pooled[n:]), p(pooled[-n:], pooled[:-n]))


def mann_whitney(base: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    """(two-sided p of the Mann-Whitney U test, the smallest p these pooled values could give).

    All samples identical is "no evidence of a difference" (p = 1).
    """
    if len(set(base) | set(new)) == 1:
        return 1.0, 1.0
    if len(base) + len(new) <= EXACT_MAX_SAMPLES:
        return _exact(base, new)
    return _asymptotic(base, new)


def mann_whitney_p(base: Sequence[float], new: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (:func:`mann_whitney`)."""
    return mann_whitney(base, new)[0]


@cache
def min_p_value(n_base: int, n_new: int) -> float:
    """The smallest p the test can return for these sample sizes: that of two completely separated samples
    without ties.

    For equal sizes n this is ``2 / C(2n, n)``: n = 6 gives 0.00216 and n = 7
    gives 0.00058, so alpha = 0.002 needs at least 7 samples a side.
    """
    if n_base < 1 or n_new < 1:
        return 1.0
    return mann_whitney_p(range(n_base), range(n_base, n_base + n_new))


def min_samples_for(alpha: float, limit: int = 1000) -> int:
    """Smallest n such that n samples on each side can reach p < alpha."""
    for n in range(1, limit + 1):
        if min_p_value(n, n) < alpha:
            return n
    raise ValueError(f"alpha={alpha} needs more than {limit} samples a side")


def classify_ratio(metric: str, base: float, new: float, factor: float) -> MetricResult:
    """Noise-free metric (exact memory): beyond ``factor`` either way is a change."""
    if not _valid([base, new]):
        return MetricResult(metric, base, new, None, Verdict.INVALID, note=f"not a finite number >= 0: {base} → {new}")
    r = ratio(base, new)
    if r > factor:
        verdict = Verdict.REGRESSION
    elif r < 1 / factor:
        verdict = Verdict.IMPROVEMENT
    else:
        verdict = Verdict.UNCHANGED
    return MetricResult(metric, base, new, r, verdict)


def classify_samples(
    metric: str, base: Sequence[float], new: Sequence[float], factor: float, alpha: float
) -> MetricResult:
    """Noisy metric (time): a change needs both the median ratio beyond ``factor`` and p < ``alpha``."""
    if not (base and new and _valid(base) and _valid(new)):
        return MetricResult(
            metric, None, None, None, Verdict.INVALID, note="samples that are not finite numbers >= 0 (or none)"
        )
    base_median, new_median = statistics.median(base), statistics.median(new)
    r = ratio(base_median, new_median)
    if 1 / factor <= r <= factor:
        return MetricResult(metric, base_median, new_median, r, Verdict.UNCHANGED)
    floor = smallest_p(base, new)  # a few samples a side can never reach alpha: no p to compute
    if floor >= alpha:
        untied = min_p_value(len(base), len(new))
        if untied >= alpha:
            note = (
                f"too few samples to reach alpha={alpha:g}: n={len(base)}/{len(new)}, "
                f"smallest possible p={untied:.3g} (need {min_samples_for(alpha)} a side)"
            )
        else:
            note = (
                f"too many ties to reach alpha={alpha:g}: n={len(base)}/{len(new)} with "
                f"{len(base) + len(new) - len(set(base) | set(new))} tied sample(s) allow p >= {floor:.3g}"
            )
        return MetricResult(metric, base_median, new_median, r, Verdict.INCONCLUSIVE, None, floor, note)
    p, floor = mann_whitney(base, new)
    if p >= alpha:
        return MetricResult(
            metric, base_median, new_median, r, Verdict.UNCHANGED, p, floor, f"not significant (p={p:.3g} >= {alpha:g})"
        )
    verdict = Verdict.REGRESSION if r > factor else Verdict.IMPROVEMENT
    return MetricResult(metric, base_median, new_median, r, verdict, p, floor)


@dataclass(frozen=True)
class Shift:
    """How many times larger ``new``'s values are than ``base``'s: the Hodges-Lehmann estimate of the ratio (the
    median of every new/base ratio of one value of each) and its distribution-free interval (Moses': order
    statistics of those ratios at the Mann-Whitney test's critical count), ``low`` to ``high`` at ``confidence``.
    Too few values for any interval at that confidence: ``low`` 0 and ``high`` inf."""

    estimate: float
    low: float
    high: float
    confidence: float


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m + n, m) splits give each Mann-Whitney count U = 0 .. m·n (no ties): the coefficients
    of the Gaussian binomial [m + n, m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i), exact in Python's ints."""
    coefficients = [1] + [0] * (m * n)
    for i in range(1, m + 1):
        for j in range(m * n, n + i - 1, -1):  # times (1 - q^(n+i)): from the top, so each reads the old value
            coefficients[j] -= coefficients[j - n - i]
        for j in range(i, m * n + 1):  # over (1 - q^i): a running sum with stride i
            coefficients[j] += coefficients[j - i]
    return tuple(coefficients)


def critical_count(m: int, n: int, confidence: float) -> int:
    """The largest k with P(U < k) <= (1 - confidence) / 2 under "one distribution" (0: none reaches it)."""
    counts, tail = _u_counts(min(m, n), max(m, n)), (1 - confidence) / 2
    total, below, k = math.comb(m + n, m), 0, 0
    while below + counts[k] <= tail * total:
        below += counts[k]
        k += 1
    return k


def ratio_interval(base: Sequence[float], new: Sequence[float], confidence: float = 0.95) -> Shift:
    """:class:`Shift` of ``new`` over ``base``, positive values (times, ratios of times): judged on their logs, so
    that x1.2 and /1.2 are the same distance. Exact for the sizes a benchmark has (up to 60 a side)."""
    if not (base and new) or min([*base, *new]) <= 0 or not _valid([*base, *new]):
        raise ValueError("ratio_interval takes positive, finite values on both sides")
    logs = np.sort(np.subtract.outer(np.log(np.asarray(new, float)), np.log(np.asarray(base, float))).ravel())
    estimate = float(np.exp(np.median(logs)))
    k = (
        critical_count(len(base), len(new), confidence)
        if max(len(base), len(new)) <= 60
        else _normal_count(len(base), len(new), confidence)
    )
    if k == 0:
        return Shift(estimate, 0.0, math.inf, confidence)
    return Shift(estimate, float(np.exp(logs[k - 1])), float(np.exp(logs[len(logs) - k])), confidence)


def _normal_count(m: int, n: int, confidence: float) -> int:
    """:func:`critical_count` by the normal approximation of U, for sizes where the exact count is slow."""
    from scipy.stats import norm

    z = float(norm.ppf(1 - (1 - confidence) / 2))
    return max(0, math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12)))
