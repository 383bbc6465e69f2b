"""The time gate's verdict on each case, from its time in each round on the two sides: pure, frames in, verdicts out.

A case's samples are its CPU time in each round (the median of its samples there; :mod:`topk_bench.gate.blocks`
runs the rounds): the variation that matters on a shared runner is from one round to the next (each round a new
child process, its memory laid out anew, the neighbours doing something else), while the samples of one round
agree within a few percent. BASE's times and NEW's are set side by side as the ratio of NEW's to BASE's, its
Hodges-Lehmann estimate and its distribution-free 95% interval (:func:`topk_bench.report.stats.ratio_interval`),
and the case is:

- ``unchanged`` (or ``improved``) when the whole interval lies below the factor: it cannot have slowed that much;
- ``regressed`` when the interval lies above 1 and the estimate beyond the factor: it slowed, by more than the
  factor as best the rounds can tell;
- ``undecided`` otherwise: the rounds are too few, or too noisy, to say which. The gate measures more rounds,
  and a case still undecided at its bound fails as "could not judge", never as a regression nor as a pass.

Not over SDPA's time in the same round: measured on shared two-core runners, the round-to-round variation of two
cases is mostly their own, so dividing by another case's adds its variance (twice the rounds for the same
interval) and divides out little; the blocks' BASE, NEW, NEW, BASE order is what keeps a drifting machine fair.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from topk_bench.report.relative import per_round, round_count, sample_times
from topk_bench.report.stats import Shift, ratio_interval
from topk_bench.results import columns as col
from topk_bench.status import Status
from topk_bench.units import short_seconds

CONFIDENCE = 0.95


class Decision(str, enum.Enum):
    UNCHANGED = "unchanged"
    IMPROVED = "improved"
    REGRESSED = "regressed"
    UNDECIDED = "undecided"

    @property
    def passes(self) -> bool:
        return self in (Decision.UNCHANGED, Decision.IMPROVED)


@dataclass(frozen=True)
class CaseRounds:
    """One case's time in each round (seconds, the median of the round's samples), from every block of one side."""

    case_id: str
    name: str
    times: tuple[float, ...]
    why_none: str = ""  # without times: why (a block of one round...)


@dataclass(frozen=True)
class CaseVerdict:
    case_id: str
    name: str
    decision: Decision
    shift: Shift  # NEW's time over BASE's
    base: tuple[float, ...]  # BASE's time in each round, seconds
    new: tuple[float, ...]

    def shift_text(self) -> str:
        """``x1.031 [x0.952, x1.118]``: the change and its interval."""
        s = self.shift
        high = "inf" if s.high == float("inf") else f"x{s.high:.3f}"
        return f"x{s.estimate:.3f} [x{s.low:.3f}, {high}]"

    def numbers(self) -> str:
        """The case's figures in one phrase: the change, its interval, both sides' median times and rounds."""
        return (
            f"{self.shift_text()} ({self.shift.confidence:.0%}); median of the rounds: BASE "
            f"{short_seconds(statistics.median(self.base))}, NEW {short_seconds(statistics.median(self.new))} "
            f"({len(self.base)} and {len(self.new)} rounds)"
        )


def decide(shift: Shift, factor: float) -> Decision:
    """The rule of the module's docstring, on NEW's time over BASE's."""
    if shift.high < factor:
        return Decision.IMPROVED if shift.high < 1 and shift.estimate < 1 / factor else Decision.UNCHANGED
    if shift.low > 1 and shift.estimate > factor:
        return Decision.REGRESSED
    return Decision.UNDECIDED


def judge(base: Iterable[CaseRounds], new: Iterable[CaseRounds], factor: float) -> list[CaseVerdict]:
    """Each case both sides have (in BASE's order), judged."""
    new_by_id = {c.case_id: c for c in new}
    verdicts = []
    for b in base:
        n = new_by_id.get(b.case_id)
        if n is None or not b.times or not n.times:
            continue
        shift = ratio_interval(b.times, n.times, CONFIDENCE)
        verdicts.append(CaseVerdict(b.case_id, b.name, decide(shift, factor), shift, b.times, n.times))
    return verdicts


def case_name(row: pd.Series) -> str:
    """``workload/label`` (the implementation's name where the row has no label)."""
    label = row.get(col.LABEL)
    return f"{row[col.WORKLOAD]}/{label if isinstance(label, str) and label else row[col.IMPL]}"


def rounds_of(blocks: Iterable[pd.DataFrame]) -> list[CaseRounds]:
    """Every case's time in each round across ``blocks`` (one side's runs, each of two rounds or more), in the
    first block's order; a row not ``ok`` or untimed in a block adds none (:func:`blocks.problems` fails on it)."""
    gathered: dict[str, tuple[str, list[float], list[str]]] = {}
    for frame in blocks:
        for _, row in frame.iterrows():
            name, times, whys = gathered.setdefault(str(row[col.CASE_ID]), (case_name(row), [], []))
            samples = sample_times(row) if str(row.get(col.STATUS)) == Status.OK else []
            rounds = per_round(samples, round_count(row))
            if rounds:
                times.extend(statistics.median(r) for r in rounds)
            elif samples:
                whys.append("one round in a block: no time per round")
    return [CaseRounds(case_id, name, tuple(t), "" if t else "; ".join(dict.fromkeys(w)) or "no time")
            for case_id, (name, t, w) in gathered.items()]  # fmt: skip
