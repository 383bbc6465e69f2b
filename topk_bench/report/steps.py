"""Steps in a series over commits (pure: numbers in, steps out): where a case's time or peak moved to another level
and stayed there, not where one commit was noisy.

Binary segmentation of the logarithms (the least-squares change point, as CUSUM finds it): the commit that splits a
stretch into two parts whose mean levels differ most, weighted by ``sqrt(n1 n2 / n)`` (a split near an end rests on
few commits and must differ more), is a step where the levels differ by more than ``factor``; each part is split
again the same way. A step's ratio is then the median of the part after it over the median of the part before it
(what a reader checks against the table), and a step that no longer passes ``factor`` by it goes. A commit whose
value alone is off, up then down again (a step and its opposite one commit apart), is an outlier, not two steps.
A commit without a value (the case failed, or is missing there) is passed over; the newest commit is judged on its
own value (the step a reader wants to see first).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# As the CPU time gate's tolerance (docs/regression.md, "The CPU time gate"): a level that moved by more than
# x1.2 is what a reviewer should look at.
STEP_FACTOR = 1.2


@dataclass(frozen=True)
class Step:
    """The series moved at ``index`` by ``ratio`` (its level after over its level before)."""

    index: int
    ratio: float

    @property
    def up(self) -> bool:
        return self.ratio > 1


def _splits(y: list[float], lo: int, hi: int, threshold: float) -> list[int]:
    """The positions in ``y[lo:hi]`` where binary segmentation splits it."""
    n = hi - lo
    if n < 2:
        return []
    best = max(
        range(lo + 1, hi),
        key=lambda k: (
            round(abs(statistics.fmean(y[k:hi]) - statistics.fmean(y[lo:k])) * math.sqrt((k - lo) * (hi - k) / n), 12),
            -k,
        ),
    )
    if abs(statistics.fmean(y[best:hi]) - statistics.fmean(y[lo:best])) <= threshold:
        return []
    return [*_splits(y, lo, best, threshold), best, *_splits(y, best, hi, threshold)]


def steps(values: Sequence[float | None], factor: float = STEP_FACTOR) -> list[Step]:
    """The steps of ``values`` (one per commit, oldest first; None: no value there)."""
    known = [(i, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v) and v > 0]
    y = [math.log(v) for _, v in known]
    splits = _splits(y, 0, len(y), math.log(factor))
    bounds = [0, *splits, len(known)]
    found = []
    for before, at, after in zip(bounds, bounds[1:], bounds[2:]):
        ratio = statistics.median(v for _, v in known[at:after]) / statistics.median(v for _, v in known[before:at])
        if abs(math.log(ratio)) > math.log(factor):
            found.append((at, Step(known[at][0], ratio)))
    out: list[tuple[int, Step]] = []
    for at, step in found:  # an excursion of one commit: an outlier
        if out and at == out[-1][0] + 1 and step.up != out[-1][1].up:
            out.pop()
            continue
        out.append((at, step))
    return [step for _, step in out]
