"""Steps in a series over commits (pure: numbers in, steps out): where a case's time or peak moved to another level
and stayed there, not where one commit was noisy.

At each commit ``i`` the level after (the median of the values of ``i`` and up to ``window - 1`` commits after it)
is divided by the level before (the median of up to ``window`` commits before it); where that ratio is beyond
``factor`` either way, ``i`` is a candidate, and of consecutive candidates the one with the largest change is the
step (a step at ``i`` also makes ``i + 1``'s window straddle it, with a smaller ratio). A commit without a value
(the case failed, or is missing there) is passed over. The newest commit is judged on its own value: a step there
is the one a reader wants to see first.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

STEP_FACTOR = 1.15
WINDOW = 3


@dataclass(frozen=True)
class Step:
    """The series moved at ``index`` by ``ratio`` (its level after over its level before)."""

    index: int
    ratio: float

    @property
    def up(self) -> bool:
        return self.ratio > 1


def steps(values: Sequence[float | None], factor: float = STEP_FACTOR, window: int = WINDOW) -> list[Step]:
    """The steps of ``values`` (one per commit, oldest first; None: no value there)."""
    known = [(i, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v) and v > 0]
    threshold = math.log(factor)
    # (position in known, log ratio, log of the commit's own value over the level before)
    candidates: list[tuple[int, float, float]] = []
    for k in range(1, len(known)):
        before = statistics.median(v for _, v in known[max(0, k - window) : k])
        after = statistics.median(v for _, v in known[k : k + window])
        change = math.log(after / before)
        if abs(change) > threshold:
            candidates.append((k, change, math.log(known[k][1] / before)))
    # The strongest first; a candidate within a window of a step already taken is that step seen again.
    taken: list[tuple[int, float, float]] = []
    for candidate in sorted(candidates, key=_strength, reverse=True):
        if all(abs(candidate[0] - k) >= window for k, _, _ in taken):
            taken.append(candidate)
    return [Step(known[k][0], math.exp(change)) for k, change, _ in sorted(taken)]


def _strength(candidate: tuple[int, float, float]) -> tuple[float, float, int]:
    """The change of the level; of equal ones, the commit whose own value moved most (the level's median can move
    a commit early: 20, 20, 10, 10 is 20 -> 10 at the third commit, not the second), then the earliest."""
    k, change, own = candidate
    return round(abs(change), 12), round(abs(own), 12), -k
