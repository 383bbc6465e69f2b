"""Where a method starts to beat a baseline along a length (pure: numbers in, a :class:`Crossover` out, float64).

The input is, at each length both were swept to, the method's value over the baseline's (time or peak): it
*wins* where that ratio is below 1. A ratio of 0 is a length where the baseline stopped (out of memory, over its
budget, out of time) and the method did not; ``inf`` one where the method stopped and the baseline did not.

- **wins everywhere in range**: below 1 at every length;
- **from X**: it loses, then wins at every length after the last loss: X is where the ratio reaches 1 on the
  straight line between those two lengths in log-log (a power law between two sizes is a straight line there;
  the cost of attention is one in the length), or the first winning length where a side stopped (no ratio
  there to draw a line through);
- **up to X**: it wins, then loses at every length after the last win (the same line, the other way);
- **nowhere in range**: it never wins; where the ratio falls with length, X is where the least-squares line of
  log ratio against log length through the last :data:`FIT_POINTS` lengths reaches 1 (extrapolated; not past
  :data:`FAR` times the largest length), else there is none.

:func:`bootstrap_interval`: the spread of the "from" length when the timing samples are drawn again with
replacement (a plain percentile bootstrap of each length's median, both sides): how far the noise of the
samples moves the length.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

# Lengths the extrapolation's line goes through (the last ones: where the trend is the asymptotic one).
FIT_POINTS = 3
# An extrapolation beyond this many times the largest length is no length anyone would run: not given.
FAR = 1000
RESAMPLES = 2000
CONFIDENCE = 0.95


class Kind(str, Enum):
    EVERYWHERE = "everywhere"
    FROM = "from"
    UP_TO = "up_to"
    NOWHERE = "nowhere"
    NO_DATA = "no_data"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Crossover:
    """Where the method wins over ``sizes`` (ascending): ``at`` the length (interpolated for ``from`` and
    ``up_to``, extrapolated or None for ``nowhere``), ``basis`` how it was found; ``low``/``high`` the bootstrap
    interval of ``at`` when known (``low`` = the smallest size: it may win below the range; ``high`` = inf: it
    may win only beyond the range)."""

    kind: Kind
    at: float | None
    basis: str
    sizes: tuple[float, ...]
    low: float | None = None
    high: float | None = None


def _loglog(x0: float, r0: float, x1: float, r1: float) -> float | None:
    """Where the straight line through (log x0, log r0) and (log x1, log r1) reaches log 1 = 0; None where a
    ratio is 0 or inf (no line to draw)."""
    if not (0 < r0 < math.inf and 0 < r1 < math.inf) or r0 == r1:
        return None
    l0, l1 = math.log(r0), math.log(r1)
    return math.exp(math.log(x0) + (0.0 - l0) * (math.log(x1) - math.log(x0)) / (l1 - l0))


def _between(xs: Sequence[float], ratios: Sequence[float], i: int) -> tuple[float, str]:
    """The length between ``xs[i]`` and ``xs[i + 1]`` where the ratio crosses 1, and how it was found: where a
    side stopped at one of them (a ratio of 0 or inf), the first length past the crossing, ``xs[i + 1]``."""
    at = _loglog(xs[i], ratios[i], xs[i + 1], ratios[i + 1])
    if at is not None:
        return at, f"interpolated in log-log between {_size(xs[i])} and {_size(xs[i + 1])}"
    j = i + 1 if ratios[i + 1] in (0.0, math.inf) else i
    who = "the baseline" if ratios[j] == 0 else "the method"
    return xs[i + 1], f"{who} stopped at {_size(xs[j])}: no ratio there to interpolate"


def _extrapolated(xs: Sequence[float], ratios: Sequence[float]) -> tuple[float | None, str]:
    """Where the log-log line through the last :data:`FIT_POINTS` finite ratios reaches 1, if it falls."""
    points = [(x, r) for x, r in zip(xs, ratios) if 0 < r < math.inf][-FIT_POINTS:]
    if len(points) < 2:
        return None, "too few lengths with a ratio to extrapolate"
    lx = np.log([p[0] for p in points])
    lr = np.log([p[1] for p in points])
    slope, intercept = np.polyfit(lx, lr, 1)
    through = f"a log-log line through the ratios at {', '.join(_size(p[0]) for p in points)}, slope {slope:+.2f}"
    if slope >= 0:
        return None, f"the ratio does not fall with length: {through}"
    log_at = -intercept / slope
    if log_at > math.log(FAR * points[-1][0]):
        return None, f"the ratio falls too slowly to extrapolate: {through} reaches 1 only past {FAR}x the range"
    return float(math.exp(log_at)), f"extrapolated from {through}"


def crossing(xs: Sequence[float], ratios: Sequence[float]) -> Crossover:
    """Where a method wins, from its ratios to the baseline at the lengths ``xs`` (ascending, > 0)."""
    xs, ratios = [float(x) for x in xs], [float(r) for r in ratios]
    sizes = tuple(xs)
    if not xs:
        return Crossover(Kind.NO_DATA, None, "no length where both have a value", sizes)
    wins = [r < 1 for r in ratios]
    if all(wins):
        return Crossover(Kind.EVERYWHERE, None, f"wins at every length from {_size(xs[0])} to {_size(xs[-1])}", sizes)
    if not any(wins):
        at, basis = _extrapolated(xs, ratios)
        return Crossover(Kind.NOWHERE, at, basis, sizes)
    if wins[-1]:
        last_loss = max(i for i, w in enumerate(wins) if not w)
        at, basis = _between(xs, ratios, last_loss)
        return Crossover(Kind.FROM, at, basis, sizes)
    last_win = max(i for i, w in enumerate(wins) if w)
    at, basis = _between(xs, ratios, last_win)
    return Crossover(Kind.UP_TO, at, basis, sizes)


def from_lengths(xs: Sequence[float], ratios: np.ndarray) -> np.ndarray:
    """The length from which the method wins, for each row of ``ratios`` (one row per resample, one column per
    length): the smallest length where it wins everywhere, ``inf`` where it does not win at the largest; else
    the log-log crossing of :func:`crossing` (vectorised: a bootstrap draws thousands of rows)."""
    x = np.asarray(xs, dtype=np.float64)
    r = np.asarray(ratios, dtype=np.float64)
    n = x.size
    out = np.full(r.shape[0], np.inf)
    loses = ~(r < 1)
    any_loss = loses.any(axis=1)
    out[~any_loss] = x[0]
    last_loss = n - 1 - np.argmax(loses[:, ::-1], axis=1)
    crossing_rows = any_loss & (last_loss < n - 1)
    rows = np.flatnonzero(crossing_rows)
    i = last_loss[rows]
    r0, r1 = r[rows, i], r[rows, i + 1]
    line = (r0 > 0) & (r0 < np.inf) & (r1 > 0) & (r1 < np.inf) & (r0 != r1)
    with np.errstate(divide="ignore", invalid="ignore"):
        l0, l1 = np.log(r0), np.log(r1)
        lx0, lx1 = np.log(x[i]), np.log(x[np.minimum(i + 1, n - 1)])
        at = np.exp(lx0 + (0.0 - l0) * (lx1 - lx0) / (l1 - l0))
    out[rows] = np.where(line, at, x[np.minimum(i + 1, n - 1)])
    return out


def _medians(samples: Sequence[float], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The median of each of ``resamples`` draws with replacement of ``samples``."""
    data = np.asarray(samples, dtype=np.float64)
    picks = rng.integers(0, data.size, size=(resamples, data.size))
    return np.median(data[picks], axis=1)


# At one length: the method's and the baseline's timing samples, or a fixed ratio (0 or inf: a side stopped).
Samples = tuple[Sequence[float], Sequence[float]] | float


def _bounds(at: Samples) -> tuple[float, float, float]:
    """(lowest, point, highest) ratio a resample can give at one length: a median of draws lies between the
    samples' least and greatest, so the ratio of two lies between least / greatest and greatest / least."""
    if not isinstance(at, tuple):
        return float(at), float(at), float(at)
    ours, theirs = at
    point = statistics.median(ours) / statistics.median(theirs)
    return min(ours) / max(theirs), point, max(ours) / min(theirs)


def _drawn(bounds: list[tuple[float, float, float]]) -> set[int]:
    """The lengths whose draws can move the "from" length: where a resample's last loss can be (the last length
    that loses in every resample, and each after it that may lose or win) and the length after each."""
    n = len(bounds)
    certain_loss = [i for i, (low, _, _) in enumerate(bounds) if low >= 1]
    start = certain_loss[-1] if certain_loss else -1
    last = [i for i in range(max(start, 0), n) if i == start or bounds[i][0] < 1 <= bounds[i][2]]
    return {j for i in last for j in (i, i + 1) if j < n}


def bootstrap_interval(
    xs: Sequence[float],
    lengths: Sequence[Samples],
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
    every_length: bool = False,
) -> tuple[float, float]:
    """The ``confidence`` percentile interval of the "from" length (:func:`from_lengths`) when each length's
    samples are drawn again with replacement and their medians divided, the method's over the baseline's.
    Seeded, each length by its own stream: the same files give the same interval.

    Only the lengths whose draws can change the result are drawn (:func:`_drawn`); the others keep their ratio,
    whose side of 1 no draw can change: the same interval as drawing every length (``every_length``), in a
    fraction of the time when there are many."""
    bounds = [_bounds(at) for at in lengths]
    drawn = set(range(len(lengths))) if every_length else _drawn(bounds)
    columns = []
    for i, at in enumerate(lengths):
        if isinstance(at, tuple) and i in drawn:
            rng = np.random.default_rng([seed, i])
            columns.append(_medians(at[0], resamples, rng) / _medians(at[1], resamples, rng))
        else:
            columns.append(np.full(resamples, bounds[i][1]))
    found = from_lengths(xs, np.column_stack(columns))
    tail = (1 - confidence) / 2
    low, high = np.quantile(found, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


def _size(x: float) -> str:
    """A length as the tables write it: 4096, 32768 (whole), else three digits."""
    return str(int(x)) if float(x).is_integer() else f"{x:.3g}"
