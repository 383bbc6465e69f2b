"""How far to trust a measured time: the one rule behind the ``trust`` column (pure: numbers in, a flag out).

pyperf's checks, made a column, and the case's own view of the cores it got: a case is

- ``busy`` when the machine had more runnable threads than cores while it ran: the
  runnable threads sampled after each timed iteration (the case's own included), per
  core, above :data:`BUSY_LOAD_PER_CORE` (median of the samples), or the 1-minute load
  average per core above it at the case's start or end (a run alone stays at or below
  1 per core when its threads are at most the cores), or a hypervisor stole more than
  :data:`BUSY_STEAL` of the CPU time;
- ``contended`` when its threads did not have the cores they asked for, whatever the
  machine's load said: in the median timed iteration, one of its threads was runnable
  but waiting for a CPU for more than :data:`CONTENDED_WAIT` of the iteration's wall time
  (``cpu_wait``, the kernel's run delay). A parallel region ends with its slowest
  thread, so an iteration is slowed by at least ``1 / (1 - wait)`` of what that thread
  did: a wait above 1/4 is a slowdown of more than 4/3, and an iteration slowed 2x by
  contention has a thread that waited half of it. A quiet machine's threads wait a few
  percent at most (a kernel thread passing by). Where the kernel does not report run
  delay (``cpu_wait`` empty) the case's CPU time per thread is the evidence instead:
  below :data:`CONTENDED_SHARE` of its wall time (``cpu_share``) it did not have its cores
  (this can also flag a multi-threaded case whose threads idle through long serial parts);
- ``noisy`` when its samples spread: coefficient of variation (sample standard
  deviation over the mean) of ``times_s`` above :data:`NOISY_CV` (pyperf's
  "the benchmark seems unstable" threshold).

The flag joins the names that apply with ``;`` in that order (``busy;contended``), or is
empty. Predicted cases (no time) are never flagged. Writers
(:func:`topk_bench.results.row.make_row`) and readers (``show``, ``plot``, ``compare``,
``run --remeasure``) use only this module.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import TypeGuard

from topk_bench.results import columns as col

BUSY_LOAD_PER_CORE = 1.0
BUSY_STEAL = 0.05
CONTENDED_WAIT = 0.25
CONTENDED_SHARE = 0.5
NOISY_CV = 0.10
BUSY, CONTENDED, NOISY = "busy", "contended", "noisy"
FLAGS = (BUSY, CONTENDED, NOISY)


def cv(times: Sequence[float]) -> float | None:
    """Sample standard deviation over the mean; None with fewer than two samples (no spread to see)."""
    if len(times) < 2:
        return None
    mean = statistics.fmean(times)
    return statistics.stdev(times) / mean if mean > 0 else None


def _above(value: float | None, limit: float) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value > limit


def _known(value: float | None) -> TypeGuard[float]:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def contended(cpu_wait: float | None, cpu_share: float | None) -> bool:
    """Whether the case's threads did not have their cores (the module's rule; ``cpu_wait`` first)."""
    if _known(cpu_wait):
        return cpu_wait > CONTENDED_WAIT
    return _known(cpu_share) and cpu_share < CONTENDED_SHARE


def flags(
    *,
    load_start: float | None,
    load_end: float | None,
    steal: float | None,
    time_cv: float | None,
    runnable: float | None = None,
    cpu_wait: float | None = None,
    cpu_share: float | None = None,
) -> str:
    """The ``trust`` cell of a measured case: the names of :data:`FLAGS` that apply, ``;``-joined, or ``""``."""
    out = []
    if any(_above(v, BUSY_LOAD_PER_CORE) for v in (load_start, load_end, runnable)) or _above(steal, BUSY_STEAL):
        out.append(BUSY)
    if contended(cpu_wait, cpu_share):
        out.append(CONTENDED)
    if _above(time_cv, NOISY_CV):
        out.append(NOISY)
    return ";".join(out)


def named(cell: object) -> set[str]:
    """The flags a ``trust`` cell names (a reader's cell may be anything: NaN, a number)."""
    return set(cell.split(";")) - {""} if isinstance(cell, str) else set()


# How the readings of several rounds of one case make the row's (runner.pooled): the worst round's.
WORST_OF_ROUNDS = {col.STEAL: max, col.RUNNABLE: max, col.CPU_WAIT: max, col.CPU_SHARE: min, col.PREEMPT_PER_S: max}


def warning(cells: Iterable[object], runs: Sequence[str] = ()) -> str | None:
    """The one line a report prints about flagged cases (None: none flagged); ``cells``: the ``trust`` column;
    ``runs``: the ``run`` arguments that measure them again (``suites/demo_time.toml --out results/demo``, one per
    results file that holds them: :func:`topk_bench.results.frame.runs_of`)."""
    counts = {flag: 0 for flag in FLAGS}
    flagged = total = 0
    for cell in cells:
        total += 1
        parts = named(cell)
        flagged += bool(parts)
        for part in parts & set(FLAGS):
            counts[part] += 1
    if not flagged:
        return None
    why = []
    if counts[BUSY]:
        why.append(f"{counts[BUSY]} on a busy machine (load above {BUSY_LOAD_PER_CORE:g} per core)")
    if counts[CONTENDED]:
        why.append(f"{counts[CONTENDED]} whose threads waited for a CPU (contended)")
    if counts[NOISY]:
        why.append(f"{counts[NOISY]} with noisy samples (CV above {NOISY_CV:.0%})")
    return (
        f"{flagged} of {total} case(s) measured under contention: {', '.join(why)}; "
        f"their times may mislead (column trust); {remeasure_hint(counts, runs)}"
    )


def remeasure_hint(counts: dict[str, int], runs: Sequence[str] = ()) -> str:
    """The command that measures the flagged rows again (``run --remeasure``), naming the flags that occur
    (``counts``: flag -> rows), in the order flags are written, and the suite and results folder of each run
    (``runs``; ``SUITE`` where none is known)."""
    named = ",".join(flag for flag, count in counts.items() if count)
    commands = [f"topk-bench run {run} --remeasure {named}" for run in runs] or [
        f"topk-bench run SUITE --remeasure {named}"
    ]
    return "measure them again on a quiet machine: " + "; ".join(commands)
