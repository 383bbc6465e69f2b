"""How far to trust a measured time: the one rule behind the ``trust`` column (pure: numbers in, a flag out).

pyperf's checks, made a column: a case is

- ``busy`` when the machine had more runnable threads than cores while it ran: the
  1-minute load average per core above :data:`BUSY_LOAD_PER_CORE` at its start or
  its end (a run alone stays at or below 1 per core: torch uses one thread per
  core), or a hypervisor stole more than :data:`BUSY_STEAL` of the CPU time;
- ``noisy`` when its samples spread: coefficient of variation (sample standard
  deviation over the mean) of ``times_s`` above :data:`NOISY_CV` (pyperf's
  "the benchmark seems unstable" threshold).

The flag is ``busy``, ``noisy``, ``busy;noisy`` or empty. Predicted cases (no
time) are never flagged. Writers (:func:`topk_bench.results.row.make_row`) and
readers (``show``, ``plot``, ``compare``) use only this module.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

BUSY_LOAD_PER_CORE = 1.0
BUSY_STEAL = 0.05
NOISY_CV = 0.10
BUSY, NOISY = "busy", "noisy"


def cv(times: Sequence[float]) -> float | None:
    """Sample standard deviation over the mean; None with fewer than two samples (no spread to see)."""
    if len(times) < 2:
        return None
    mean = statistics.fmean(times)
    return statistics.stdev(times) / mean if mean > 0 else None


def _above(value: float | None, limit: float) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value > limit


def flags(*, load_start: float | None, load_end: float | None, steal: float | None,
          time_cv: float | None) -> str:
    """The ``trust`` cell of a measured case: ``busy``, ``noisy``, ``busy;noisy`` or ``""``."""
    out = []
    if _above(load_start, BUSY_LOAD_PER_CORE) or _above(load_end, BUSY_LOAD_PER_CORE) or _above(steal, BUSY_STEAL):
        out.append(BUSY)
    if _above(time_cv, NOISY_CV):
        out.append(NOISY)
    return ";".join(out)


def warning(cells: Iterable[object]) -> str | None:
    """The one line a report prints about flagged cases (None: none flagged); ``cells``: the ``trust`` column."""
    counts = {BUSY: 0, NOISY: 0}
    flagged = total = 0
    for cell in cells:
        total += 1
        parts = str(cell).split(";") if isinstance(cell, str) and cell else []
        flagged += bool(parts)
        for part in parts:
            if part in counts:
                counts[part] += 1
    if not flagged:
        return None
    why = []
    if counts[BUSY]:
        why.append(f"{counts[BUSY]} on a busy machine (load above {BUSY_LOAD_PER_CORE:g} per core)")
    if counts[NOISY]:
        why.append(f"{counts[NOISY]} with noisy samples (CV above {NOISY_CV:.0%})")
    return (f"{flagged} of {total} case(s) measured under contention: {', '.join(why)}; "
            f"their times may mislead (column trust); {remeasure_hint(counts)}")


def remeasure_hint(counts: dict[str, int]) -> str:
    """The command that measures the flagged rows again (``run --remeasure``, issue 30), naming the flags
    that occur (``counts``: flag -> rows), in the order flags are written."""
    named = ",".join(flag for flag, count in counts.items() if count)
    return f"measure them again on a quiet machine: topk-bench run SUITE --remeasure {named}"
