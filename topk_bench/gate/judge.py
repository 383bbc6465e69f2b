"""The time gate's verdict on each case, from the per-round ratios of its two sides: pure, frames in, verdicts out.

A case's samples are its time over its reference's (SDPA at its parameters) in the same round, one per round
(:mod:`topk_bench.report.relative`): what the machine does to both in that round divides out. BASE's ratios and
NEW's are set side by side as the ratio of NEW's to BASE's, its Hodges-Lehmann estimate and its distribution-free
95% interval (:func:`topk_bench.report.stats.ratio_interval`), and the case is:

- ``unchanged`` (or ``improved``) when the whole interval lies below the factor: it cannot have slowed that much;
- ``regressed`` when the interval lies above 1 and the estimate beyond the factor: it slowed, by more than the
  factor as best the rounds can tell;
- ``undecided`` otherwise: the rounds are too few, or too noisy, to say which. The gate measures more rounds,
  and a case still undecided at its bound fails as "could not judge", never as a regression nor as a pass.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from topk_bench.report import relative
from topk_bench.report.stats import Shift, ratio_interval
from topk_bench.results import columns as col
from topk_bench.units import missing

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
class CaseRatios:
    """One case's per-round ratios over its reference, gathered from every block of one side."""

    case_id: str
    name: str
    ratios: tuple[float, ...]
    why_none: str = ""  # without ratios: why (no reference at its parameters...)


@dataclass(frozen=True)
class CaseVerdict:
    case_id: str
    name: str
    decision: Decision
    shift: Shift  # NEW's ratio over BASE's
    base: tuple[float, ...]  # BASE's per-round ratios
    new: tuple[float, ...]

    def shift_text(self) -> str:
        """``x1.031 [x0.952, x1.118]``: the change and its interval."""
        s = self.shift
        high = "inf" if s.high == float("inf") else f"x{s.high:.3f}"
        return f"x{s.estimate:.3f} [x{s.low:.3f}, {high}]"

    def numbers(self) -> str:
        """The case's figures in one phrase: the change, its interval, both sides' median ratios and rounds."""
        return (
            f"{self.shift_text()} ({self.shift.confidence:.0%}); over the reference: BASE "
            f"{statistics.median(self.base):.4g}, NEW {statistics.median(self.new):.4g} "
            f"({len(self.base)} and {len(self.new)} rounds)"
        )


def decide(shift: Shift, factor: float) -> Decision:
    """The rule of the module's docstring, on NEW's ratio over BASE's."""
    if shift.high < factor:
        return Decision.IMPROVED if shift.high < 1 and shift.estimate < 1 / factor else Decision.UNCHANGED
    if shift.low > 1 and shift.estimate > factor:
        return Decision.REGRESSED
    return Decision.UNDECIDED


def judge(base: Iterable[CaseRatios], new: Iterable[CaseRatios], factor: float) -> list[CaseVerdict]:
    """Each case both sides have (in BASE's order), judged."""
    new_by_id = {c.case_id: c for c in new}
    verdicts = []
    for b in base:
        n = new_by_id.get(b.case_id)
        if n is None or not b.ratios or not n.ratios:
            continue
        shift = ratio_interval(b.ratios, n.ratios, CONFIDENCE)
        verdicts.append(CaseVerdict(b.case_id, b.name, decide(shift, factor), shift, b.ratios, n.ratios))
    return verdicts


def case_name(row: pd.Series) -> str:
    """``workload/label`` (the implementation's name where the row has no label)."""
    label = row.get(col.LABEL)
    return f"{row[col.WORKLOAD]}/{label if isinstance(label, str) and label else row[col.IMPL]}"


def ratios_of(blocks: Iterable[pd.DataFrame], reference: str, side: str) -> list[CaseRatios]:
    """Every case's per-round ratios over ``reference`` across ``blocks`` (one side's runs, each of two rounds or
    more), in the first block's order; a row without a ratio in a block (not ok, untimed) adds none."""
    gathered: dict[str, tuple[str, list[float], list[str]]] = {}
    for frame in blocks:
        for index, found in relative.relative_times(frame, reference, side).items():
            row = frame.loc[index]
            name, ratios, whys = gathered.setdefault(str(row[col.CASE_ID]), (case_name(row), [], []))
            if isinstance(found, str):
                whys.append(found)
            elif found.by_round:
                ratios.extend(r for r in found.samples if not missing(r))
            else:
                whys.append("one round in a block: no ratio per round")
    return [CaseRatios(case_id, name, tuple(r), "" if r else "; ".join(dict.fromkeys(w)) or "no ratio")
            for case_id, (name, r, w) in gathered.items()]  # fmt: skip
