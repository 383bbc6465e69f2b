"""``compare PREDICTED MEASURED`` (either order): how far a CUDA prediction is from a measurement of the same
cases.

A prediction and a measurement never share a ``case_id`` (the method is part of it), and a prediction cannot
regress, so they are not judged as a gate: their cases are paired on what the case is (workload,
implementation, label, mode and every parameter column, dtype included) and each pair says its predicted and
measured time (the time model's eager iteration, or its device time for a row timed as a CUDA graph's replay)
and peak, with the ratios; below, the median of |predicted / measured - 1| and how many pairs are within 2x.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from topk_bench.results import columns as col
from topk_bench.results.columns import parameter_columns
from topk_bench.status import Status
from topk_bench.types import Method, Timer
from topk_bench.units import missing

_DESCRIBING = (col.WORKLOAD, col.IMPL, col.LABEL, col.MODE)


@dataclass(frozen=True)
class Pair:
    name: str
    predicted_s: float | None
    measured_s: float | None
    predicted_peak: float | None
    measured_peak: float | None

    @staticmethod
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b is not None and b > 0 else None

    @property
    def time_ratio(self) -> float | None:
        return self.ratio(self.predicted_s, self.measured_s)

    @property
    def peak_ratio(self) -> float | None:
        return self.ratio(self.predicted_peak, self.measured_peak)


def applies(base: pd.DataFrame, new: pd.DataFrame) -> bool:
    """One side all predicted, the other all measured."""
    methods = {frozenset(f[col.METHOD].astype(str)) for f in (base, new) if col.METHOD in f.columns}
    return methods == {frozenset({Method.PREDICTED.value}), frozenset({Method.MEASURED.value})}


def _number(value) -> float | None:
    return None if value is None or missing(value) else float(value)


def _plain(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _keys(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    cells = frame.reindex(columns=columns).astype(str).where(frame.reindex(columns=columns).notna(), "")
    return cells.apply(lambda r: "\x1f".join(r), axis=1) if len(frame) else pd.Series(dtype=str)


def pairs(base: pd.DataFrame, new: pd.DataFrame) -> list[Pair]:
    """The ``ok`` cases of the predicted side and of the measured side paired on what the case is."""
    predicted, measured = (base, new) if (base[col.METHOD] == Method.PREDICTED).all() else (new, base)
    predicted = predicted[predicted[col.STATUS] == Status.OK]
    measured = measured[measured[col.STATUS] == Status.OK]
    params = sorted(set(parameter_columns(predicted.columns)) | set(parameter_columns(measured.columns)))
    key_columns = [*_DESCRIBING, *params]
    by_key = dict(zip(_keys(predicted, key_columns), predicted.to_dict("records")))
    # A case is named by what varies within one implementation (seq_len), not across them (chunk_size).
    varying = [c for c in params if c in measured and (measured.groupby(col.IMPL)[c].nunique() > 1).any()]
    out = []
    for key, m in zip(_keys(measured, key_columns), measured.to_dict("records")):
        p = by_key.get(key)
        if p is None:
            continue
        graph = str(m.get(col.TIMER)) == Timer.CUDAGRAPH
        time = p.get(col.DEVICE_TIME_PREDICTED_S if graph else col.TIME_PREDICTED_S)
        name = f"{m[col.WORKLOAD]}/{m.get(col.LABEL) or m[col.IMPL]}" + "".join(
            f" {c}={_plain(m[c])}" for c in varying if not missing(m.get(c))
        )
        out.append(
            Pair(
                name,
                _number(time),
                _number(m.get(col.TIME_MEDIAN_S)),
                _number(p.get(col.PEAK_BYTES)),
                _number(m.get(col.PEAK_BYTES)),
            )
        )
    return out


def lines(found: list[Pair]) -> list[str]:
    """The table and its summary, as text."""
    if not found:
        return ["predicted against measured: no case of one side is on the other (same workload, method, parameters)"]
    out = [f"{'case':56} {'measured':>10} {'predicted':>10} {'ratio':>6}  {'peak ratio':>10}"]
    for p in found:
        ms = f"{p.measured_s * 1e3:.3f}ms" if p.measured_s is not None else "-"
        ps = f"{p.predicted_s * 1e3:.3f}ms" if p.predicted_s is not None else "-"
        tr = f"{p.time_ratio:.2f}" if p.time_ratio is not None else "-"
        pr = f"{p.peak_ratio:.4f}" if p.peak_ratio is not None else "-"
        out.append(f"{p.name[:56]:56} {ms:>10} {ps:>10} {tr:>6}  {pr:>10}")
    ratios = [p.time_ratio for p in found if p.time_ratio is not None]
    if ratios:
        median = statistics.median(abs(r - 1) for r in ratios)
        within = sum(0.5 <= r <= 2 for r in ratios)
        out.append(
            f"time: median |predicted / measured - 1| = {median:.1%} over {len(ratios)} case(s), "
            f"{within} within 2x (the time model: docs/predicting.md)"
        )
    return out
