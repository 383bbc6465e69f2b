"""``compare --relative-to IMPL``: each case's time as a multiple of IMPL's at the same parameters in the same
file, so that what the machine does to both (a shared CI runner, a clock that drifts, another CPU of the pool)
divides out, and what is left is the method's own change.

The reference of a case is the row of IMPL (its ``impl`` or its ``label``) with the case's device, method,
workload and mode whose parameters, where it has them, are the case's: SDPA has no ``topk``, so one SDPA row
at a ``seq_len`` is the reference of every top-k variant at that ``seq_len``. The samples compared are:

- with ``rounds`` > 1 on both rows (interleaved rounds: the two measured minutes apart, not hours), one ratio
  per round, the medians of the case's and the reference's samples of that round;
- otherwise one per sample of the case, over the median of the reference's.

``compare`` judges them as it judges times (median ratio beyond the factor and the Mann-Whitney test), under
the metric name :func:`metric_name`. Pure: frames in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from topk_bench.errors import BadInput
from topk_bench.report.stats import ratio
from topk_bench.results import columns as col
from topk_bench.results.columns import parameter_columns
from topk_bench.status import Status
from topk_bench.units import missing

FLAG = "--relative-to"
# A reference is found among rows of the same of these, besides its parameters.
SAME = (col.DEVICE, col.METHOD, col.WORKLOAD, col.MODE)


def metric_name(impl: str) -> str:
    return f"time_vs_{impl}"


@dataclass(frozen=True)
class Relative:
    """A case's time over its reference's: ``samples`` one per round (``by_round``) or one per sample."""

    samples: list[float]
    reference: str  # the reference row's case_id
    by_round: bool


def round_count(row: Mapping) -> int:
    """The row's ``rounds`` (1 where it has none)."""
    value = row.get(col.ROUNDS)
    return 1 if value is None or missing(value) else int(value)


def sample_times(row: Mapping) -> list[float]:
    """The row's ``times_s`` as seconds ([] where it has none, or one that does not read)."""
    value = row.get(col.TIMES_S)
    if not isinstance(value, str) or not value.strip():
        return []
    try:
        return [float(x) for x in value.split(";") if x.strip()]
    except ValueError:
        return []


def per_round(times: list[float], rounds: int) -> list[list[float]]:
    """The samples of each round (``times_s`` holds them round after round, the same number each)."""
    if rounds < 2 or len(times) % rounds:
        return []
    size = len(times) // rounds
    return [times[i * size : (i + 1) * size] for i in range(rounds)]


def references(frame: pd.DataFrame, impl: str, side: str) -> pd.DataFrame:
    """The rows of ``impl`` (by implementation name, else by label); BadInput naming what the file has."""
    rows = frame[frame[col.IMPL].astype(str) == impl]
    if not len(rows) and col.LABEL in frame.columns:
        rows = frame[frame[col.LABEL].astype(str) == impl]
    if not len(rows) and len(frame):
        present = ", ".join(sorted(frame[col.IMPL].astype(str).unique()))
        raise BadInput(f"{side} has no row of {impl!r} to divide by (implementations there: {present})", key=FLAG)
    return rows


# What finding and dividing by a reference reads of a row.
_READ = (col.CASE_ID, col.IMPL, col.LABEL, col.STATUS, col.TIMES_S, col.ROUNDS)


def _rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple[object, dict]]:
    """(index, row as a dict of ``columns``) of every row: one pass, column by column (``iterrows`` makes a Series
    per row, 20x slower)."""
    present = [c for c in columns if c in frame.columns]
    return [(i, dict(zip(present, v))) for i, v in zip(frame.index, zip(*(frame[c].tolist() for c in present)))]


def _key(row: dict, params: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(str(row.get(c)) for c in (*SAME, *params))


def relative_times(frame: pd.DataFrame, impl: str, side: str) -> dict[object, Relative | str]:
    """Per row of ``frame`` (by its index) that is not a reference: its :class:`Relative`, or why it has none.
    Rows that are not ``ok`` or not timed get nothing (their status, or the lack of a time, says it all).

    Linear in rows: the references are indexed by the parameters each has (SDPA's rows by every parameter but
    ``topk``...), so that a case looks its reference up once per kind of reference, never row by row."""
    refs = references(frame, impl, side)
    params = parameter_columns(frame.columns)
    columns = list(dict.fromkeys([*_READ, *SAME, *params]))
    # (parameters a reference has) -> (its SAME and those parameters' values, as text) -> references
    indexed: dict[tuple[str, ...], dict[tuple[str, ...], list[dict]]] = {}
    for _, reference in _rows(refs, columns):
        has = tuple(p for p in params if not missing(reference.get(p)))
        indexed.setdefault(has, {}).setdefault(_key(reference, has), []).append(reference)
    is_reference = set(refs.index)
    out: dict[object, Relative | str] = {}
    for index, row in _rows(frame, columns):
        if index in is_reference or str(row.get(col.STATUS)) != Status.OK:
            continue
        times = sample_times(row)
        if not times:
            continue
        found = [
            reference
            for has, by_key in indexed.items()
            if not any(missing(row.get(p)) for p in has)
            for reference in by_key.get(_key(row, has), [])
        ]
        if len(found) > 1:
            labels = ", ".join(str(r.get(col.LABEL) or r[col.IMPL]) for r in found)
            raise BadInput(
                f"{side}: {len(found)} rows of {impl!r} match case {row[col.CASE_ID]} ({labels}): name one by its "
                "label",
                key=FLAG,
            )
        if not found:
            out[index] = f"no {impl} at its parameters"
            continue
        reference = found[0]
        ref_times = sample_times(reference)
        if str(reference.get(col.STATUS)) != Status.OK or not ref_times:
            out[index] = f"{impl} at its parameters is {reference.get(col.STATUS)}, untimed"
            continue
        out[index] = divide(times, round_count(row), ref_times, round_count(reference), str(reference[col.CASE_ID]))
    return out


def divide(times: list[float], rounds: int, ref_times: list[float], ref_rounds: int, reference: str) -> Relative:
    """The case's samples over the reference's: round by round where both have the same rounds, else each
    sample over the reference's median."""
    mine, theirs = per_round(times, rounds), per_round(ref_times, ref_rounds)
    if mine and len(mine) == len(theirs):
        ratios = [ratio(statistics.median(b), statistics.median(a)) for a, b in zip(mine, theirs)]
        return Relative(ratios, reference, by_round=True)
    middle = statistics.median(ref_times)
    return Relative([ratio(middle, t) for t in times], reference, by_round=False)
