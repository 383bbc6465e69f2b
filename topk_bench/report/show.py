"""``topk-bench show``: results as tables that fit the terminal.

By default one pivot table per suite, device and method: a row per
implementation (and per value of any other parameter that varies), a column per
value of the swept parameter, each cell the median time over the peak memory,
or the status where a case is not ``ok``. Columns that do not fit the width go
into a further table below. ``wide`` shows the flat list instead: one row per
case with every parameter that varies, status, peak, median, IQR, the result
columns that have values, the trust flag and the error.

A time measured under contention (:mod:`topk_bench.results.trust`) is marked
``*``, and one warning line says how many.

What the files say (labels, suites, parameter values, errors) is shown as text
(:mod:`topk_bench.untrusted`): no markup, no terminal command. Both layouts take
time linear in the rows: cells are made column by column, and the tables are laid
out by :mod:`topk_bench.report.texttable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console

from topk_bench import units
from topk_bench.report.texttable import TextTable
from topk_bench.results import columns as col
from topk_bench.results import trust
from topk_bench.results.columns import optional_columns, parameter_columns
from topk_bench.results.frame import left_out, load_results, results_folders, runs_of
from topk_bench.status import Status
from topk_bench.types import Method
from topk_bench.units import GIB, missing
from topk_bench.untrusted import shown

DEFAULT_WIDTH = 100
_LEFT = (col.LABEL, col.STATUS, col.METHOD, col.DEVICE, col.TRUST, col.CODE_PATH)
# The row header of a pivot never takes more than this share of the width: the values are the point.
_ROW_HEADER_SHARE = 0.3
_MARK = "*"
_PREDICTED = "~"  # before a predicted time (topk_bench.predict.timing): the modelled GPU's, not a measurement


def _cell(value) -> str:
    if missing(value):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def short_seconds(value) -> str:
    """``812us``, ``12.3ms``, ``1.23s``: three digits, no space (a pivot cell is narrow)."""
    return units.short_seconds(value, space="")


def short_bytes(value) -> str:
    """``36.5GiB``, ``7.70GiB``, ``0.978GiB``, ``512MiB``: three digits, no space."""
    return units.short_bytes(value, space="")


def _varying(rows: pd.DataFrame) -> list[str]:
    return [c for c in parameter_columns(rows.columns) if rows[c].dropna().astype(str).nunique() > 1]


def _plain(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _sort_key(value):
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def exceeded_peak(row: Mapping) -> float | None:
    """The peak of an ``over_budget`` row that exceeded its budget: the larger of its peaks, allocated and
    reserved, above ``max_memory_bytes`` (as the child judged it); the peak when the budget is not in the row."""
    limit = row.get(col.MAX_MEMORY_BYTES)
    peaks = [
        float(p) for p in (row.get(col.PEAK_BYTES), row.get(col.RESERVED_BYTES)) if p is not None and not missing(p)
    ]
    over = [p for p in peaks if limit is None or missing(limit) or p > float(limit)]
    return max(over) if over else None


def pivot_cell(row: Mapping) -> str:
    """Median time over peak memory (``*`` after a time measured under contention, ``~`` before a predicted
    one); the status when not ok, and beside ``over_budget`` the peak that exceeded the budget."""
    if row[col.STATUS] != Status.OK:
        peak = exceeded_peak(row) if row[col.STATUS] == Status.OVER_BUDGET else None
        return str(row[col.STATUS]) + (f"\n{short_bytes(peak)}" if peak is not None else "")
    lines = []
    if not missing(row[col.TIME_MEDIAN_S]):
        flagged = isinstance(row.get(col.TRUST), str) and row.get(col.TRUST)
        lines.append(short_seconds(row[col.TIME_MEDIAN_S]) + (_MARK if flagged else ""))
    elif not missing(row.get(col.TIME_PREDICTED_S)):
        lines.append(_PREDICTED + short_seconds(row[col.TIME_PREDICTED_S]))
    if not missing(row[col.PEAK_BYTES]):
        lines.append(short_bytes(row[col.PEAK_BYTES]))
    return "\n".join(lines) or "ok"


def _width(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


def _chunks(widths: list[int], room: int) -> list[list[int]]:
    """Column indices split into runs of even length whose cells (plus two spaces each) fit ``room``."""
    count = len(widths)
    for parts in range(1, count + 1):
        size = -(-count // parts)
        runs = [list(range(i, min(i + size, count))) for i in range(0, count, size)]
        if all(sum(widths[i] + 2 for i in run) <= room for run in runs):
            return runs
    return [[i] for i in range(count)]


def what_of(method: str, timed: bool = False) -> str:
    """What a pivot's cells hold; ``timed``: a prediction with predicted times."""
    if method == Method.MEASURED:
        return "median time / peak memory"
    return f"{_PREDICTED}predicted time / peak memory" if timed else "peak memory"


def pivot_tables(frame: pd.DataFrame, width: int = DEFAULT_WIDTH) -> list[TextTable]:
    """The pivot tables of a results frame (one or more per suite, device, method and model), each within
    ``width``."""
    return [table for what_ran, caption, rows in grids(frame) for table in _pivot(rows, what_ran, caption, width)]


def _per_model(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(caption, rows) per model when a suite has several (the inference suites): the model, and the shape
    columns that vary across the suite but not within the model (q_heads, kv_heads, head_dim), said once."""
    if "model" not in rows or rows["model"].nunique() < 2:
        return [("", rows)]
    varying = _varying(rows)
    out = []
    for model, part in rows.groupby("model", sort=False):
        fixed = [c for c in varying if c != "model" and part[c].astype(str).nunique() == 1 and part[c].notna().all()]
        shape = ", ".join(f"{c} {_plain(part[c].iloc[0])}" for c in fixed)
        out.append((f"model {model}" + (f": {shape}" if shape else ""), part))
    return out


@dataclass
class Grid:
    """One pivot: a row per name, a column per value of the swept parameter ``x`` (None: one column, ``what``),
    each cell the text of the case there ("" where none); the names, values and cells shown as text."""

    what: str  # what the cells hold: "median time / peak memory"
    x: str | None
    xs: list[str]
    names: list[str]
    cells: dict[tuple[str, str], str]

    def cell(self, name: str, x: str) -> str:
        return self.cells.get((name, x), "")


def grid(rows: pd.DataFrame, cells: list[str] | None = None, what: str | None = None) -> Grid:
    """Implementations x the swept parameter for one group of rows (one suite, device and method); ``cells``:
    each row's cell (default :func:`pivot_cell`), ``what`` what they hold."""
    method = rows[col.METHOD].iloc[0]
    # A row per implementation (its legend names its options); the columns: the swept parameter, one that
    # every row has and that varies within an implementation (seq_len first; a suite of one case per
    # implementation has none), then rows split by whatever else varies within one.
    legend = rows[col.WORKLOAD] + "/" + pd.Series(col.legends(rows), index=rows.index)
    within = [c for c in _varying(rows) if (rows[c].astype(str).groupby(legend).nunique() > 1).any()]
    swept = [c for c in within if rows[c].notna().all()]
    x = "seq_len" if "seq_len" in swept else max(swept, key=lambda c: rows[c].nunique(), default=None)
    others = [c for c in within if c != x]
    if rows[col.WORKLOAD].nunique() > 1:
        others.insert(0, col.WORKLOAD)
    names = pd.Series(col.legends(rows), index=rows.index)
    for c in others:
        if c != col.WORKLOAD:
            names += rows[c].map(lambda v, c=c: "" if missing(v) else f" {c}={_plain(v)}")
    if col.WORKLOAD in others:
        names = rows[col.WORKLOAD].astype(str) + ": " + names
    names = names.map(shown)
    timed = col.TIME_PREDICTED_S in rows.columns and rows[col.TIME_PREDICTED_S].notna().any()
    what = what or what_of(method, timed)
    if cells is None:
        shown_columns = [col.STATUS, col.TIME_MEDIAN_S, col.PEAK_BYTES, col.TRUST]
        shown_columns += [
            c for c in (col.RESERVED_BYTES, col.MAX_MEMORY_BYTES, col.TIME_PREDICTED_S) if c in rows.columns
        ]
        cells = [pivot_cell(r) for r in rows[shown_columns].to_dict("records")]
    rows = rows.assign(
        _name=names,
        _x=[shown(_plain(v)) for v in rows[x]] if x else [what] * len(rows),
        _cell=cells,
    )
    return Grid(
        what,
        x,
        sorted(rows["_x"].unique(), key=_sort_key),
        list(dict.fromkeys(rows["_name"])),
        {(n, v): c for n, v, c in zip(rows["_name"], rows["_x"], rows["_cell"])},
    )


def grids(frame: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(what ran: "suite · device · method", caption, rows) of each pivot of a results frame: one per suite,
    device, method and model (:func:`_per_model`)."""
    out = []
    for (suite, device, method), rows in frame.groupby([col.SUITE, col.DEVICE, col.METHOD], sort=False):
        for caption, part in _per_model(rows):
            out.append((shown(f"{suite} · {device} · {method}"), shown(caption), part))
    return out


def _pivot(rows: pd.DataFrame, what_ran: str, caption: str, width: int) -> list[TextTable]:
    """:func:`grid` of one group of rows, in as many tables as ``width`` needs."""
    pivot = grid(rows)
    order, xs, x = pivot.names, pivot.xs, pivot.x
    head = min(max(len(n) for n in order), int(width * _ROW_HEADER_SHARE))
    widths = [max([len(str(v))] + [_width(pivot.cell(n, v)) for n in order]) for v in xs]
    runs = _chunks(widths, width - head - 2)
    out = []
    for part, run in enumerate(runs, start=1):
        title = f"{what_ran} · {caption}\n" if caption else f"{what_ran} · "
        title += f"{pivot.what} by {x or 'case'}" + (f" ({part}/{len(runs)})" if len(runs) > 1 else "")
        out.append(
            TextTable(
                title,  # its parts shown already; its line break is the layout's
                [shown(x or "case"), *(xs[i] for i in run)],
                [False, *(True for _ in run)],
                [[n, *(pivot.cell(n, xs[i]) for i in run)] for n in order],  # cells: numbers, statuses
                max_widths=[head, *(None for _ in run)],
            )
        )
    return out


def tables(path: str | Path, errors: bool = True) -> list[TextTable]:
    return _tables(load_results(path), errors)


def _texts(values: pd.Series) -> list[str]:
    """A column's cells as text (:func:`_cell`), shown as text (:func:`topk_bench.untrusted.shown`)."""
    return [shown(_cell(v)) for v in values]


def _tables(frame, errors: bool) -> list[TextTable]:
    """The flat list (``--wide``): one row per case."""
    out = []
    for suite, rows in frame.groupby(col.SUITE, sort=False):
        params = [c for c in parameter_columns(rows.columns) if rows[c].nunique(dropna=True) > 1]
        if rows[col.WORKLOAD].nunique() > 1:  # a suite mixing workloads (smoke)
            params.insert(0, col.WORKLOAD)
        optional = [c for c in optional_columns() if c in rows.columns and rows[c].notna().any()]
        # Which code ran, where the machine decides it: shown where a row says.
        code = [col.CODE_PATH] if col.CODE_PATH in rows.columns and rows[col.CODE_PATH].notna().any() else []
        peak = pd.to_numeric(rows[col.PEAK_BYTES], errors="coerce") / GIB
        columns: dict[str, list[str]] = {
            col.LABEL: [shown(label) for label in col.legends(rows)],
            **{c: _texts(rows[c]) for c in params},
            **{c: _texts(rows[c]) for c in (col.METHOD, col.DEVICE, col.STATUS)},
            "peak GiB": _texts(peak),
            "median s": _texts(rows[col.TIME_MEDIAN_S]),
            "IQR s": _texts(rows[col.TIME_IQR_S]),
            **{c: _texts(rows[c]) for c in optional},
            col.TRUST: _texts(rows[col.TRUST]),
            **{c: _texts(rows[c].fillna("")) for c in code},
        }
        if errors:
            columns[col.ERROR] = _texts(rows[col.ERROR].astype(str).str[:80])
        names = [shown(name) for name in columns]
        right = [name not in _LEFT and name != col.ERROR for name in columns]
        out.append(
            TextTable(shown(f"{suite} ({len(rows)} rows)"), names, right, [list(r) for r in zip(*columns.values())])
        )
    return out


def warning_lines(frame: pd.DataFrame, marked: bool = False) -> list[str]:
    """What ``show`` says below its tables: the lines left out, and how many times may mislead."""
    measured = frame[col.METHOD] == Method.MEASURED
    flagged = trust.warning(frame.loc[measured, col.TRUST], runs_of(frame, measured & (frame[col.TRUST] != "")))
    return [*left_out(frame), *([flagged + (f" (marked {_MARK})" if marked else "")] if flagged else [])]


def show(
    path: str | Path,
    errors: bool = True,
    console: Console | None = None,
    warnings: Console | None = None,
    *,
    wide: bool = False,
    width: int | None = None,
) -> None:
    """The tables on ``console`` (pivots within ``width``, or the flat list when ``wide``); on ``warnings``
    (stderr), the lines of the files that are not in them and how many times were measured under contention.
    A directory's sub-folders too, each under its name (``results/`` after ``make demo``: ``results/demo``)."""
    folders = results_folders(Path(path))
    frames = [load_results(folder) for folder in folders]  # every file read before anything is printed
    if wide:
        console = console or Console(width=max(width or 0, 220))
    else:
        width = width or DEFAULT_WIDTH
        console = console or Console(width=width)
    warnings = warnings or Console(stderr=True)
    for folder, frame in zip(folders, frames):
        if folder != Path(path):
            console.print(shown(f"{folder}:"), highlight=False, markup=False, emoji=False)
        for table in _tables(frame, errors) if wide else pivot_tables(frame, width or DEFAULT_WIDTH):
            table.print(console)
            console.file.write("\n")
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    frame.attrs = {key: [d for f in frames for d in f.attrs.get(key, [])] for key in ("dropped", "files")}
    for line in warning_lines(frame, marked=not wide):
        warnings.print(shown(f"warning: {line}"), highlight=False, markup=False, emoji=False, soft_wrap=True)


def crossover_tables(frame: pd.DataFrame, baseline: str | None = None, length: str | None = None) -> list[TextTable]:
    """``show --crossover``: per suite, device and method, where each method beats the dense baseline in time and
    in memory (:mod:`topk_bench.report.crossovers`, the numbers of ``report``'s crossovers.csv)."""
    from topk_bench.report import crossovers as cross

    found = cross.crossovers(frame, baseline, length)
    groups: dict[tuple[str, str, str], list[cross.Found]] = {}
    for f in found:
        groups.setdefault((f.suite, f.device, f.method), []).append(f)
    out = []
    for (suite, device, method), members in groups.items():
        first = members[0]
        rows = []
        for f in members:
            c = f.crossover
            interval = f"{cross.length_text(c.low)} to {cross.length_text(c.high)}" if c.low is not None else ""
            rows.append([shown(f.name), f.metric, str(c.kind), cross.length_text(c.at), interval, shown(c.basis)])
        title = shown(f"{suite} · {device} · {method} · crossover against {first.baseline} along {first.length}")
        header = ["method", "metric", "wins", first.length, "95% interval", "basis"]
        out.append(
            TextTable(
                title,
                header,
                [False, False, False, True, True, False],
                rows,
                max_widths=[30, None, None, None, None, 60],
            )
        )
    return out


def show_crossovers(
    path: str | Path, baseline: str | None = None, length: str | None = None, console: Console | None = None
) -> None:
    """The crossover tables of every results folder of ``path`` (one line when there is none to show)."""
    console = console or Console(width=DEFAULT_WIDTH)
    folders = results_folders(Path(path))
    frames = [load_results(folder) for folder in folders]  # every file read before anything is printed
    for folder, frame in zip(folders, frames):
        tables = crossover_tables(frame, baseline, length)
        if folder != Path(path):
            console.print(shown(f"{folder}:"), highlight=False, markup=False, emoji=False)
        for table in tables:
            table.print(console)
            console.file.write("\n")
        if not tables:
            console.print(
                shown(f"{folder}: no crossover: no swept length (seq_len, kv_len) or no baseline (sdpa, vanilla)"),
                highlight=False,
                markup=False,
                emoji=False,
            )
