"""``compare``: match two result sets by ``case_id`` and judge every case (memory, time, status).

Rules (docs/CONTRACTS.md, "topk-bench compare"):

- status: ``ok`` in BASE and anything else in NEW is a regression (the reverse an improvement);
- ``peak_bytes``: ratio beyond ``memory_factor`` — exact on ``cpu``/``predict``, and
  ``max_memory_allocated`` on CUDA is deterministic for a fixed program too;
- ``reserved_bytes`` (where both sides have it: CUDA): the caching allocator's rounding and
  fragmentation make it move a little, hence its own looser ``reserved_factor``;
- time: median ratio beyond ``time_factor`` and Mann-Whitney p < ``alpha`` on ``times_s``.

A gate must not pass on nothing: beyond a regression, the comparison fails when
it compared no case (no row on a side, or no case with a peak or a time on both sides), when a case of BASE is missing
from NEW (unless
``allow_missing``: a suite that lost cases on purpose), when a line of either
side was left out by the reader (cut, an unknown status, a number that is not a
finite number >= 0, a repeated case_id), or when a value is ``invalid`` (among them
an ``ok`` case of NEW without a peak or samples its BASE had). Cases
only in NEW are listed, not judged.
"""

from __future__ import annotations

import collections
import functools
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from topk_bench.errors import BadInput
from topk_bench.report import pairing, relative
from topk_bench.report.stats import MetricResult, Verdict, classify_ratio, classify_samples
from topk_bench.report.thresholds import DEFAULT_THRESHOLDS, Thresholds
from topk_bench.results import columns as col
from topk_bench.results import trust
from topk_bench.results.columns import parameter_columns
from topk_bench.results.frame import left_out, load_results, runs_of
from topk_bench.status import Status
from topk_bench.types import Method
from topk_bench.units import missing

# Worst first: a case's verdict is the worst of its metrics.
SEVERITY = (Verdict.REGRESSION, Verdict.INVALID, Verdict.INCONCLUSIVE, Verdict.IMPROVEMENT, Verdict.UNCHANGED)
# Verdicts that fail the gate.
FAILING = (Verdict.REGRESSION, Verdict.INVALID)


@dataclass
class CaseComparison:
    case_id: str
    name: str
    device: str
    method: str
    base_status: str
    new_status: str
    metrics: list[MetricResult] = field(default_factory=list)

    @property
    def status_verdict(self) -> Verdict:
        if self.base_status == self.new_status:
            return Verdict.UNCHANGED
        if self.base_status == Status.OK:
            return Verdict.REGRESSION
        return Verdict.IMPROVEMENT if self.new_status == Status.OK else Verdict.UNCHANGED

    @functools.cached_property
    def verdict(self) -> Verdict:
        """The worst of its status's and its metrics' (read once the case is judged: every report asks it again)."""
        verdicts = {self.status_verdict, *(m.verdict for m in self.metrics)}
        return next(v for v in SEVERITY if v in verdicts)

    def metric(self, name: str) -> MetricResult | None:
        return next((m for m in self.metrics if m.metric == name), None)


@dataclass
class Comparison:
    base: str
    new: str
    thresholds: Thresholds
    cases: list[CaseComparison]
    only_new: list[tuple[str, str]]  # (case_id, name)
    only_base: list[tuple[str, str]]
    warnings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # why the gate fails beyond the cases' verdicts
    first_run: bool = False  # no BASE yet (the first run of main): NEW is exported, nothing is judged
    pairing: list[str] = field(default_factory=list)  # --pair-by: how the cases were paired, what differs
    relative_to: str = ""  # --relative-to: times judged as multiples of this implementation's (report.relative)

    def with_verdict(self, verdict: Verdict) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict is verdict]

    @property
    def has_regression(self) -> bool:
        return bool(self.with_verdict(Verdict.REGRESSION))

    @property
    def passed(self) -> bool:
        return not self.failures and not any(self.with_verdict(v) for v in FAILING)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def load(path: str | Path) -> pd.DataFrame:
    """A results CSV or directory, one row per ``case_id`` (``load_results``: the last one, the others left out)."""
    data = load_results(path)
    attrs = data.attrs
    data = data.set_index(col.CASE_ID, drop=False)
    data.attrs = attrs
    return data


def parse_times(value: object, *, file: str, case_id: str) -> list[float]:
    """``times_s`` cell → samples; empty for cases that were not timed (predicted, failed)."""
    if not isinstance(value, str) or not value.strip():
        return []
    try:
        return [float(x) for x in value.split(";") if x.strip()]
    except ValueError:
        raise BadInput(
            f"expected ';'-separated seconds, got {value!r}", file=file, key=f"times_s of {case_id}"
        ) from None


# What judging a case and naming it read of its row.
_JUDGED = (
    col.CASE_ID,
    col.SUITE,
    col.WORKLOAD,
    col.IMPL,
    col.LABEL,
    col.MODE,
    col.DEVICE,
    col.METHOD,
    col.STATUS,
    col.ERROR,
    col.PEAK_BYTES,
    col.RESERVED_BYTES,
    col.TIME_MEDIAN_S,
    col.TIMES_S,
)


def records(frame: pd.DataFrame, params: list[str]) -> dict[str, dict]:
    """Each case's row as a dict (the columns judging and naming it read), by ``case_id``, in the frame's order:
    one pass over the frame, where a lookup per case (``frame.loc[cid]``) makes a Series each time."""
    columns = [c for c in dict.fromkeys([*_JUDGED, *params]) if c in frame.columns]
    values = zip(*(frame[c].tolist() for c in columns))  # column by column: to_dict boxes every cell, 3x slower
    return {row[col.CASE_ID]: row for row in (dict(zip(columns, v)) for v in values)}


def varying_parameters(*frames: pd.DataFrame) -> list[str]:
    """Parameter columns with more than one value across the runs: the ones that tell cases apart in a table."""
    both = pd.concat(frames, ignore_index=True, sort=False)
    return [p for p in parameter_columns(both.columns) if both[p].dropna().astype(str).nunique() > 1]


def case_name(row: Mapping, params: list[str]) -> str:
    """Human-readable and stable: label (or impl), mode, then the non-empty parameter values."""
    label = col.legend(row.get(col.LABEL), row[col.IMPL])
    values = [f"{p}={_plain(row[p])}" for p in params if p in row and not missing(row[p])]
    mode = row.get(col.MODE)
    head = f"{row.get('workload')}/{label}" if isinstance(row.get(col.WORKLOAD), str) else label
    head += f" {mode}" if isinstance(mode, str) else ""
    return " ".join([head, *values])


def compare_frames(
    base: pd.DataFrame,
    new: pd.DataFrame,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    base_label: str = "BASE",
    new_label: str = "NEW",
    allow_missing: bool = False,
    pair_by: list[str] | None = None,
    relative_to: str | None = None,
) -> Comparison:
    """Judge every case of NEW found in BASE; ``allow_missing``: cases of BASE absent from NEW do not fail;
    ``pair_by``: cases found by the values of these columns instead of their case_id (:mod:`.pairing`);
    ``relative_to``: times judged as multiples of this implementation's at the same parameters in the same file
    (:mod:`.relative`)."""
    thresholds = thresholds.validate()
    paired = pairing.pair(base, new, pair_by) if pair_by else None
    if paired is not None:
        base, new = paired.base, paired.new
        params = [c for c in pair_by or [] if c in parameter_columns(new.columns)]
    else:
        params = varying_parameters(base, new)
    # After the pairing: each side's references are found within that side, keyed as its cases are.
    divided = (
        (relative.relative_times(base, relative_to, base_label), relative.relative_times(new, relative_to, new_label))
        if relative_to
        else None
    )
    # Keyed as the frames are (case_id, or the pairing's key); named by each row's own case_id.
    base_rows = dict(zip(base.index, records(base, params).values()))
    new_rows = dict(zip(new.index, records(new, params).values()))
    common = [cid for cid in new_rows if cid in base_rows]
    only_new = [(row[col.CASE_ID], case_name(row, params)) for cid, row in new_rows.items() if cid not in base_rows]
    only_base = [(row[col.CASE_ID], case_name(row, params)) for cid, row in base_rows.items() if cid not in new_rows]
    if not common and len(base) and len(new):
        raise BadInput(
            f"no case of {new_label} pairs with one of {base_label} by {', '.join(pair_by or [])}"
            if paired is not None
            else f"no case_id in common between {base_label} and {new_label} (different suite, device or method?); "
            "to compare runs that differ in an option, pair their cases with --pair-by (e.g. impl,seq_len)"
        )
    cases = [
        _compare_case(
            cid, base_rows[cid], new_rows[cid], params, thresholds, base_label, new_label, divided, relative_to
        )
        for cid in common
    ]
    if paired is not None and not paired.common:  # each case says what differs in its pair
        for cid, case in zip(common, cases):
            case.name += f" ({paired.differences[cid]})"
    warnings = [_machines_differ(base.loc[common], new.loc[common]), _code_differs(base, new, common, params)]
    warnings += [
        f"{side}: {line}"
        for side, frame in (("BASE", base), ("NEW", new))
        for line in [_contended(frame.loc[common])]
        if line
    ]
    failures = [f"{side} {line}" for side, frame in (("BASE", base), ("NEW", new)) for line in left_out(frame)]
    if not cases:  # one side is empty (both non-empty without a common case_id is bad input, above)
        empty = [side for side, frame in (("BASE", base), ("NEW", new)) if not len(frame)]
        failures.append(f"nothing compared: {' and '.join(empty)} {'has' if len(empty) == 1 else 'have'} no valid row")
    elif not any(case.metrics for case in cases):  # every case failed on a side, or has no number on both
        failures.append(
            f"nothing compared: none of the {len(cases)} case(s) in common has a peak or a time on "
            "both sides (statuses " + _statuses(cases) + ")"
        )
    if relative_to and divided is not None:
        warnings.append(_not_divided(divided[0], common, relative_to))
        metric = relative.metric_name(relative_to)
        if cases and not any(case.metric(metric) for case in cases):
            failures.append(
                f"nothing compared relative to {relative_to}: no case in common has a time and a {relative_to} "
                "row at its parameters on both sides"
            )
    if only_base and not allow_missing:
        failures.append(
            f"{len(only_base)} case(s) of BASE missing from NEW (--allow-missing if the suite lost them on purpose)"
        )
    return Comparison(
        base_label,
        new_label,
        thresholds,
        cases,
        only_new,
        only_base,
        [w for w in warnings if w],
        failures,
        pairing=pairing.lines(paired) if paired is not None else [],
        relative_to=relative_to or "",
    )


def first_run(
    new: pd.DataFrame,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    base_label: str = "BASE",
    new_label: str = "NEW",
    relative_to: str | None = None,
) -> Comparison:
    """No BASE exists yet (the first run of main, ``--allow-no-base``): every case of NEW is new, nothing is
    judged; the gate still fails when NEW has no valid row or a line of it was left out."""
    thresholds = thresholds.validate()
    if relative_to:
        relative.references(new, relative_to, new_label)  # an IMPL NEW lacks is bad input, as with a BASE
    params = varying_parameters(new)
    failures = [f"NEW {line}" for line in left_out(new)]
    rows = records(new, params)
    if not len(new):
        failures.append("nothing to export: NEW has no valid row")
    return Comparison(
        base_label,
        new_label,
        thresholds,
        [],
        [(cid, case_name(row, params)) for cid, row in rows.items()],
        [],
        [],
        failures,
        first_run=True,
        relative_to=relative_to or "",
    )


def _statuses(cases: list[CaseComparison]) -> str:
    """``error -> crashed x3, ok x1``: the status pairs of the cases, for the line that says nothing was compared."""
    pairs = collections.Counter(
        c.base_status if c.base_status == c.new_status else f"{c.base_status} -> {c.new_status}" for c in cases
    )
    return ", ".join(f"{pair} x{count}" for pair, count in pairs.most_common())


def _contended(rows: pd.DataFrame) -> str | None:
    """One warning line when times of these rows were measured under contention (None: none were)."""
    if col.TRUST not in rows.columns:
        return None
    measured = rows[col.METHOD] == Method.MEASURED
    return trust.warning(rows.loc[measured, col.TRUST], runs_of(rows, measured & (rows[col.TRUST] != "")))


# What makes two runs' numbers differ besides the code: the machine (judged on measured rows: a prediction
# depends on no hardware) and the software (on every row: kernels and the allocator come with it).
HARDWARE = (col.DEVICE_NAME, col.CPU_CAPABILITY, col.CPU_FLAGS)
SOFTWARE = (col.TORCH_VERSION, col.CUDA_VERSION, col.CUDNN_VERSION, col.DRIVER_VERSION)


def _machines_differ(base: pd.DataFrame, new: pd.DataFrame) -> str:
    """One warning line when the two runs come from different hardware or software (the verdicts may mislead);
    "" when they do not, or when a side does not say (a CSV without the column is no difference)."""
    measured = [
        frame.loc[frame[col.METHOD] == Method.MEASURED] if col.METHOD in frame.columns else frame
        for frame in (base, new)
    ]
    differences = [_difference(measured[0], measured[1], c) for c in HARDWARE]
    differences += [_difference(base, new, c) for c in SOFTWARE]
    differences = [d for d in differences if d]
    if not differences:
        return ""
    return (
        "BASE and NEW ran on different hardware or software ("
        + "; ".join(differences)
        + "): times (and CUDA memory) may not be comparable"
    )


def _code_differs(base: pd.DataFrame, new: pd.DataFrame, common: list, params: list[str]) -> str:
    """One warning line naming the cases whose code path differs between the two runs (one case_id, two programs:
    compiled kernels on one side, torch's on the other, say); "" when none does, or a side does not say."""
    if col.CODE_PATH not in base.columns or col.CODE_PATH not in new.columns:
        return ""

    # Column against column (a lookup per case makes a Series each time: minutes at 100,000 cases).
    paths = [frame[col.CODE_PATH].reindex(common).astype(object).fillna("").astype(str) for frame in (base, new)]
    differs = paths[0] != paths[1]
    changed = list(differs.index[differs])
    if not changed:
        return ""
    named = ", ".join(case_name(new.loc[cid], params) for cid in changed[:3])
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    example = f"{paths[0][changed[0]] or 'none'} vs {paths[1][changed[0]] or 'none'}"
    return f"code_path differs in {len(changed)} case(s) ({named}{more}): {example}: the two runs ran different code"


def _difference(base: pd.DataFrame, new: pd.DataFrame, column: str) -> str:
    if column not in base.columns or column not in new.columns:
        return ""
    values = [sorted({_plain_text(v) for v in frame[column].dropna() if str(v)}) for frame in (base, new)]
    if not values[0] or not values[1] or values[0] == values[1]:
        return ""
    return f"{column} {', '.join(values[0])} vs {', '.join(values[1])}"


def _plain_text(value: object) -> str:
    return str(_plain(value))


def _not_divided(base: dict, common: list, impl: str) -> str:
    """One warning line for the cases whose time could not be divided in BASE (no reference row): not judged."""
    judged = set(common)
    reasons = collections.Counter(why for cid, why in base.items() if isinstance(why, str) and cid in judged)
    if not reasons:
        return ""
    count = sum(reasons.values())
    return f"{count} case(s) of BASE without a time of {impl} to divide by, their time not judged: " + "; ".join(
        f"{why} ({n})" for why, n in reasons.most_common()
    )


def _compare_case(
    key: object,
    b: Mapping,
    n: Mapping,
    params: list[str],
    t: Thresholds,
    base_label: str,
    new_label: str,
    divided: tuple[dict, dict] | None = None,
    relative_to: str | None = None,
) -> CaseComparison:
    """Case ``key`` (its case_id, or the pairing's key: how ``divided`` knows it) judged from its rows ``b`` and
    ``n``."""
    case = CaseComparison(
        str(n[col.CASE_ID]),
        case_name(n, params),
        str(n[col.DEVICE]),
        str(n[col.METHOD]),
        str(b[col.STATUS]),
        str(n[col.STATUS]),
    )
    if case.base_status != Status.OK or case.new_status != Status.OK:
        return case  # nothing to measure on a failed side; the status verdict says it all
    for column, factor in ((col.PEAK_BYTES, t.memory_factor), (col.RESERVED_BYTES, t.reserved_factor)):
        if not missing(b[column]):
            case.metrics.append(
                _lost(column, float(b[column]))
                if missing(n[column])
                else classify_ratio(column, float(b[column]), float(n[column]), factor)
            )
    base_times = parse_times(b[col.TIMES_S], file=base_label, case_id=case.case_id)
    new_times = parse_times(n[col.TIMES_S], file=new_label, case_id=case.case_id)
    if divided is not None and relative_to:
        result = _relative_time(divided[0].get(key), divided[1].get(key), relative.metric_name(relative_to), t)
        if result is not None:
            case.metrics.append(result)
    elif base_times:
        case.metrics.append(
            classify_samples("time_s", base_times, new_times, t.time_factor, t.alpha)
            if new_times
            else _lost("time_s", statistics.median(base_times))
        )
    return case


def _relative_time(
    base: relative.Relative | str | None, new: relative.Relative | str | None, metric: str, t: Thresholds
) -> MetricResult | None:
    """The verdict on a case's time over its reference's; None where BASE has none to judge by (a reference row
    itself, an untimed case, or no reference: said once in a warning)."""
    if not isinstance(base, relative.Relative):
        return None
    if new is None:
        return _lost(metric, statistics.median(base.samples))
    if isinstance(new, str):
        return MetricResult(metric, statistics.median(base.samples), None, None, Verdict.INVALID, note=f"NEW: {new}")
    return classify_samples(metric, base.samples, new.samples, t.time_factor, t.alpha)


def _lost(metric: str, base: float) -> MetricResult:
    """An ``ok`` case of NEW without a number its BASE had: nothing to judge it by, so the gate cannot pass."""
    return MetricResult(metric, base, None, None, Verdict.INVALID, note="BASE has a value, NEW has none")


def _plain(value: object) -> object:
    """1024.0 → 1024 (pandas reads integer columns with gaps as floats)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
