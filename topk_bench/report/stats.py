"""Pure statistics for ``compare``: is one metric of one case a regression, an improvement, or neither?

The time rule is asv's (``asv/_stats.py``, ``asv compare``): a change counts only
when the median ratio exceeds a factor *and* a Mann-Whitney U test on the raw
samples rejects "same distribution" at ``alpha``. The test is two-sided because
the direction is read from the data (the ratio): a one-sided test in the
direction the data point to would double the false-positive rate.

Memory is compared by ratio alone: peaks from the ``cpu`` and ``predict``
backends are exact (no noise), so any growth beyond the factor is real.

No I/O, no pandas: everything here takes numbers and returns numbers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Sequence

from scipy.stats import mannwhitneyu


class Verdict(str, Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    UNCHANGED = "unchanged"
    # The ratio moved beyond the factor but the samples are too few for the
    # test to ever reach alpha: neither flagged nor silently passed.
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class MetricResult:
    """Outcome of one metric (``peak_bytes``, ``time_s``...) of one case."""

    metric: str
    base: float | None
    new: float | None
    ratio: float | None          # new / base; inf when base is 0 and new is not
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


def mann_whitney_p(base: Sequence[float], new: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (scipy picks exact for small samples without ties).

    All samples identical is "no evidence of a difference" (p = 1); scipy
    would return NaN there.
    """
    if len(set(base) | set(new)) == 1:
        return 1.0
    return float(mannwhitneyu(base, new, alternative="two-sided").pvalue)


@lru_cache(maxsize=None)
def min_p_value(n_base: int, n_new: int) -> float:
    """The smallest p the test can return for these sample sizes: that of two completely separated samples.

    For equal sizes n and the exact test this is ``2 / C(2n, n)``: n = 6 gives
    0.00216 and n = 7 gives 0.00058, so alpha = 0.002 needs at least 7 samples a side.
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
    r = ratio(base, new)
    if r > factor:
        verdict = Verdict.REGRESSION
    elif r < 1 / factor:
        verdict = Verdict.IMPROVEMENT
    else:
        verdict = Verdict.UNCHANGED
    return MetricResult(metric, base, new, r, verdict)


def classify_samples(metric: str, base: Sequence[float], new: Sequence[float],
                     factor: float, alpha: float) -> MetricResult:
    """Noisy metric (time): a change needs both the median ratio beyond ``factor`` and p < ``alpha``."""
    base_median, new_median = statistics.median(base), statistics.median(new)
    r = ratio(base_median, new_median)
    if 1 / factor <= r <= factor:
        return MetricResult(metric, base_median, new_median, r, Verdict.UNCHANGED)
    floor = min_p_value(len(base), len(new))
    if floor >= alpha:
        note = (f"too few samples to reach alpha={alpha:g}: n={len(base)}/{len(new)}, "
                f"smallest possible p={floor:.3g} (need {min_samples_for(alpha)} a side)")
        return MetricResult(metric, base_median, new_median, r, Verdict.INCONCLUSIVE, None, floor, note)
    p = mann_whitney_p(base, new)
    if p >= alpha:
        return MetricResult(metric, base_median, new_median, r, Verdict.UNCHANGED, p, floor,
                            f"not significant (p={p:.3g} >= {alpha:g})")
    verdict = Verdict.REGRESSION if r > factor else Verdict.IMPROVEMENT
    return MetricResult(metric, base_median, new_median, r, verdict, p, floor)
