"""The crossover lengths of a results frame: for each method of a suite, from which length it beats the suite's
dense baseline in time and in memory (``show --crossover``, ``report``'s page and its ``crossovers.csv``).

- **The baseline** is the suite's best dense attention: SDPA (``sdpa``) where the rows have it, else the
  plain implementation (``vanilla``); ``baseline`` names another (an implementation or a label).
- **The length** is the first of :data:`LENGTHS` the rows sweep (more than one value), or ``length``.
- **A method's series** is its rows of one (suite, device, method, workload, mode, label) and one value of
  every other parameter (``budget=1024``); at each length it is compared with the baseline's row of the same
  device, method, workload, mode and length whose other parameters, where the baseline has them, are its own
  (SDPA has no ``topk``: one SDPA row is the reference of every top-k at that length).
- **Values**: time is the median of the samples (measured) or ``time_predicted_s`` (a CUDA prediction);
  memory is the peak (allocated). A side that stopped there (out of memory, over its budget, out of time, or
  skipped after one of those) loses that length; a length where neither has a value, or a side failed
  otherwise (an error, unsupported), is left out. A predicted peak over the budget is exact: it is compared.
- The computation is :mod:`topk_bench.report.crossover`'s; the bootstrap interval is drawn from the samples of
  measured times (``times_s``), seeded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from topk_bench.report.crossover import Crossover, Kind, Samples, bootstrap_interval, crossing
from topk_bench.results import columns as col
from topk_bench.results.columns import parameter_columns
from topk_bench.status import STOPPING, Status
from topk_bench.types import Method
from topk_bench.units import missing

DEFAULT_BASELINES = ("sdpa", "vanilla")
LENGTHS = ("seq_len", "kv_len")
METRICS = ("time", "memory")
# A side that did not run a length because of one of these lost it (SKIPPED: a smaller size stopped).
_LOST = frozenset({*STOPPING, Status.SKIPPED})
SAME = (col.SUITE, col.DEVICE, col.METHOD, col.WORKLOAD, col.MODE)
# The crossovers.csv columns, in order.
CSV_COLUMNS = (
    "suite",
    "device",
    "method",
    "workload",
    "mode",
    "name",
    "baseline",
    "length",
    "metric",
    "kind",
    "crossover",
    "low",
    "high",
    "first_length",
    "last_length",
    "basis",
    "sentence",
)


@dataclass(frozen=True)
class Found:
    """One method's crossover with the baseline in one metric, and where it was found."""

    suite: str
    device: str
    method: str
    workload: str
    mode: str
    name: str  # the method's legend and the parameters that set its series apart (budget=1024)
    baseline: str
    length: str
    metric: str  # time or memory
    crossover: Crossover

    @property
    def predicted(self) -> bool:
        return self.method == Method.PREDICTED


def length_of(rows: pd.DataFrame, length: str | None = None) -> str | None:
    """The length the rows are compared along: ``length``, or the first of :data:`LENGTHS` they sweep."""
    if length is not None:
        return length if length in rows.columns else None
    for name in LENGTHS:
        if name in rows.columns and pd.to_numeric(rows[name], errors="coerce").nunique() > 1:
            return name
    return None


def baseline_rows(rows: pd.DataFrame, baseline: str | None) -> tuple[str | None, pd.DataFrame]:
    """(its name, its rows): ``baseline``'s rows (by implementation, else by label), or the first of
    :data:`DEFAULT_BASELINES` the rows have."""
    for name in [baseline] if baseline is not None else DEFAULT_BASELINES:
        chosen = rows[rows[col.IMPL].astype(str) == name]
        if not len(chosen):
            chosen = rows[rows[col.LABEL].astype(str) == name]
        if len(chosen):
            return name, chosen
    return None, rows.iloc[0:0]


def _records(rows: pd.DataFrame, columns: Iterable[str]) -> list[dict]:
    """Each row as a dict of ``columns`` (those it has), column by column (``iterrows`` is 20x slower)."""
    present = [c for c in dict.fromkeys(columns) if c in rows.columns]
    return [dict(zip(present, values)) for values in zip(*(rows[c].tolist() for c in present))]


def cell_text(value) -> str:
    """A parameter's cell as a table writes it: ``1024``, not ``1024.0``; "" where empty."""
    if missing(value):
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _samples(row: Mapping) -> list[float]:
    cell = row.get(col.TIMES_S)
    if not isinstance(cell, str) or not cell.strip():
        return []
    return [float(t) for t in cell.split(";") if t.strip()]


def value(row: Mapping, metric: str) -> float | None:
    """The row's time or peak where it is known (None: not known)."""
    status = str(row.get(col.STATUS))
    predicted = str(row.get(col.METHOD)) == Method.PREDICTED
    if metric == "memory":
        exact = status == Status.OK or (predicted and status == Status.OVER_BUDGET)
        number = row.get(col.PEAK_BYTES)
    else:
        exact = status == Status.OK
        number = row.get(col.TIME_PREDICTED_S if predicted else col.TIME_MEDIAN_S)
    return float(number) if exact and number is not None and not missing(number) else None


def _compared(mine: Mapping, theirs: Mapping, metric: str) -> tuple[float, Samples] | None:
    """At one length: the ratio of the two sides' values and what a bootstrap draws from (the samples of
    measured times, else the ratio itself); None: nothing to compare."""
    a, b = value(mine, metric), value(theirs, metric)
    if a is not None and b is not None:
        if b <= 0:
            return (math.inf, math.inf) if a > 0 else None
        if metric == "time" and str(mine.get(col.METHOD)) == Method.MEASURED:
            ours, reference = _samples(mine), _samples(theirs)
            if ours and reference:
                return a / b, (ours, reference)
        return a / b, a / b
    if a is not None and str(theirs.get(col.STATUS)) in _LOST:
        return 0.0, 0.0
    if b is not None and str(mine.get(col.STATUS)) in _LOST:
        return math.inf, math.inf
    return None


def _found(xs: list[float], compared: list[tuple[float, Samples]]) -> Crossover:
    """The crossover of one series, with its bootstrap interval where some length has samples on both sides
    (a length without: its ratio in every draw)."""
    found = crossing(xs, [ratio for ratio, _ in compared])
    if found.kind is Kind.FROM and any(isinstance(drawn, tuple) for _, drawn in compared):
        low, high = bootstrap_interval(xs, [drawn for _, drawn in compared])
        found = Crossover(found.kind, found.at, found.basis, found.sizes, low, high)
    return found


def crossovers(
    frame: pd.DataFrame, baseline: str | None = None, length: str | None = None, methods: Iterable[str] | None = None
) -> list[Found]:
    """Every method's crossover with the baseline, per suite, device and method (measured, predicted), in time
    and in memory; ``methods``: only these (implementations or labels)."""
    wanted = set(methods) if methods is not None else None
    out: list[Found] = []
    for _, rows in frame.groupby([col.SUITE, col.DEVICE, col.METHOD], sort=False):
        x = length_of(rows, length)
        name, references = baseline_rows(rows, baseline)
        if x is None or name is None:
            continue
        rest = rows.drop(index=references.index)
        if wanted is not None:
            rest = rest[rest[col.IMPL].astype(str).isin(wanted) | rest[col.LABEL].astype(str).isin(wanted)]
        out += _group(rest, references, col.legends(references)[0], x)
    return out


def _length(value) -> float | None:
    """A length cell as a number > 0 (None: empty, not a number, or not positive: a stranger's cell)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _indexed(references: pd.DataFrame, columns: list[str], params: list[str], x: str) -> dict:
    """(parameters a reference has) -> (its SAME, length and those parameters' values) -> references."""
    indexed: dict[tuple[str, ...], dict[tuple[str, ...], list[dict]]] = {}
    for reference in _records(references, columns):
        has = tuple(p for p in params if not missing(reference.get(p)))
        key = tuple(cell_text(reference.get(c)) for c in (*SAME, x, *has))
        indexed.setdefault(has, {}).setdefault(key, []).append(reference)
    return indexed


def _series(rows: pd.DataFrame, columns: list[str], params: list[str]) -> dict[tuple, list[dict]]:
    """The rows of each method's series, keyed by (SAME..., its name)."""
    # What tells two series of one legend apart (budget=1024): a parameter that varies within a legend.
    legends = pd.Series(col.legends(rows), index=rows.index)
    varying = [p for p in params if len(rows) and (rows[p].astype(str).groupby(legends).nunique() > 1).any()]
    series: dict[tuple, list[dict]] = {}
    for row in _records(rows, columns):
        legend = col.legend(row.get(col.LABEL), row.get(col.IMPL))
        named = " ".join([legend, *(f"{p}={cell_text(row.get(p))}" for p in varying if cell_text(row.get(p)))])
        series.setdefault((*(str(row.get(c)) for c in SAME), named), []).append(row)
    return series


def _group(rows: pd.DataFrame, references: pd.DataFrame, baseline: str, x: str) -> list[Found]:
    params = [p for p in parameter_columns(rows.columns) if p != x]
    columns = [*SAME, x, *params, col.IMPL, col.LABEL, col.STATUS, col.PEAK_BYTES, col.TIME_MEDIAN_S, col.TIMES_S]
    columns.append(col.TIME_PREDICTED_S)
    indexed = _indexed(references, columns, params, x)
    out = []
    for (suite, device, method, workload, mode, named), members in _series(rows, columns, params).items():
        matched = []  # (length, row, its one reference)
        for row in members:
            length = _length(row.get(x))
            found = [
                reference
                for has, by_key in indexed.items()
                if not any(missing(row.get(p)) for p in has)
                for reference in by_key.get(tuple(cell_text(row.get(c)) for c in (*SAME, x, *has)), [])
            ]
            if length is not None and len(found) == 1:  # several: the baseline is ambiguous there
                matched.append((length, row, found[0]))
        matched.sort(key=lambda m: m[0])
        for metric in METRICS:
            compared = [(at, c) for at, row, reference in matched if (c := _compared(row, reference, metric))]
            if compared:
                crossover = _found([at for at, _ in compared], [c for _, c in compared])
                out.append(Found(suite, device, method, workload, mode, named, baseline, x, metric, crossover))
    return out


def length_text(value: float | None) -> str:
    """A length as a sentence writes it: a whole number (2896), three digits past a million (1.23e+07)."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.0f}" if value < 1e6 else f"{value:.3g}"


_BETTER = {"time": "is faster than", "memory": "has a smaller peak than"}


def sentence(found: Found) -> str:
    """What the page and ``show --crossover`` say of one crossover."""
    c = found.crossover
    first, last = length_text(c.sizes[0]), length_text(c.sizes[-1])
    better = ("is predicted faster than" if found.predicted else _BETTER["time"]) if found.metric == "time" else None
    better = better or _BETTER["memory"]
    head = f"{found.name} {better} {found.baseline}"
    where = f"{found.length} {first} to {last}"
    if c.kind is Kind.EVERYWHERE:
        return f"{head} everywhere in range ({where})."
    if c.kind is Kind.FROM:
        interval = f"; 95% bootstrap interval {_interval(c)}" if c.low is not None else ""
        return f"{head} from {found.length} ≈ {length_text(c.at)} on ({c.basis}{interval})."
    if c.kind is Kind.UP_TO:
        return f"{head} up to {found.length} ≈ {length_text(c.at)} only ({c.basis})."
    if c.kind is Kind.NOWHERE and c.at is not None:
        return f"{head} nowhere in range ({where}; about {length_text(c.at)}, {c.basis})."
    if c.kind is Kind.NOWHERE:
        return f"{head} nowhere in range ({where}; {c.basis})."
    return f"{head}: {c.basis}."


def phrase(found: Found) -> str:
    """Where it wins, in a few words (a cell of the page's summary)."""
    c = found.crossover
    if c.kind is Kind.EVERYWHERE:
        return "everywhere in range"
    if c.kind is Kind.FROM:
        return f"from ≈ {length_text(c.at)}" + (f" (95%: {_interval(c)})" if c.low is not None else "")
    if c.kind is Kind.UP_TO:
        return f"up to ≈ {length_text(c.at)} only"
    if c.kind is Kind.NOWHERE:
        return "nowhere in range" + (f" (extrapolated: about {length_text(c.at)})" if c.at is not None else "")
    return "-"


def _interval(c: Crossover) -> str:
    assert c.low is not None and c.high is not None, "an interval has both ends"
    low = f"≤ {length_text(c.low)}" if c.low <= c.sizes[0] else length_text(c.low)
    high = f"beyond {length_text(c.sizes[-1])}" if not math.isfinite(c.high) else length_text(c.high)
    return f"{low} to {high}"


def table(found: list[Found]) -> pd.DataFrame:
    """The crossovers as ``crossovers.csv`` writes them (:data:`CSV_COLUMNS`)."""
    records = []
    for f in found:
        c = f.crossover
        records.append(
            {
                "suite": f.suite,
                "device": f.device,
                "method": f.method,
                "workload": f.workload,
                "mode": f.mode,
                "name": f.name,
                "baseline": f.baseline,
                "length": f.length,
                "metric": f.metric,
                "kind": str(c.kind),
                "crossover": c.at,
                "low": c.low,
                "high": c.high,
                "first_length": c.sizes[0],
                "last_length": c.sizes[-1],
                "basis": c.basis,
                "sentence": sentence(f),
            }
        )
    return pd.DataFrame.from_records(records, columns=list(CSV_COLUMNS))
