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
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from topk_bench import units
from topk_bench.results import columns as col
from topk_bench.results import trust
from topk_bench.results.columns import optional_columns, parameter_columns
from topk_bench.results.frame import left_out, load_results, results_folders, runs_of
from topk_bench.status import Status
from topk_bench.types import Method
from topk_bench.units import GIB, missing

DEFAULT_WIDTH = 100
_LEFT = (col.LABEL, col.STATUS, col.METHOD, col.DEVICE, col.TRUST, col.CODE_PATH)
# The row header of a pivot never takes more than this share of the width: the values are the point.
_ROW_HEADER_SHARE = 0.3
_MARK = "*"


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


def pivot_cell(row: pd.Series) -> str:
    """Median time over peak memory (``*`` after a time measured under contention); the status when not ok."""
    if row[col.STATUS] != Status.OK:
        return str(row[col.STATUS])
    lines = []
    if not missing(row[col.TIME_MEDIAN_S]):
        flagged = isinstance(row.get(col.TRUST), str) and row.get(col.TRUST)
        lines.append(short_seconds(row[col.TIME_MEDIAN_S]) + (_MARK if flagged else ""))
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


def what_of(method: str) -> str:
    return "median time / peak memory" if method == Method.MEASURED else "peak memory"


def pivot_tables(frame: pd.DataFrame, width: int = DEFAULT_WIDTH) -> list[Table]:
    """The pivot tables of a results frame (one or more per suite, device, method and model), each within
    ``width``."""
    out = []
    for (suite, device, method), rows in frame.groupby([col.SUITE, col.DEVICE, col.METHOD], sort=False):
        for caption, part in _per_model(rows):
            out += _pivot(part, f"{suite} · {device} · {method}", caption, width)
    return out


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


def _pivot(rows: pd.DataFrame, what_ran: str, caption: str, width: int) -> list[Table]:
    """Implementations x the swept parameter for one group of rows, in as many tables as ``width`` needs."""
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
    names = []
    for _, r in rows.iterrows():
        name = col.legend(r[col.LABEL], r[col.IMPL])
        name += "".join(f" {c}={_plain(r[c])}" for c in others if c != col.WORKLOAD and not missing(r[c]))
        names.append(f"{r['workload']}: {name}" if col.WORKLOAD in others else name)
    rows = rows.assign(
        _name=names,
        _x=[_plain(v) for v in rows[x]] if x else [what_of(method)] * len(rows),
        _cell=[pivot_cell(r) for _, r in rows.iterrows()],
    )
    xs = sorted(rows["_x"].unique(), key=_sort_key)
    order = list(dict.fromkeys(names))
    cells = {(n, v): c for n, v, c in zip(rows["_name"], rows["_x"], rows["_cell"])}
    head = min(max(len(n) for n in order), int(width * _ROW_HEADER_SHARE))
    widths = [max([len(str(v))] + [_width(cells.get((n, v), "")) for n in order]) for v in xs]
    runs = _chunks(widths, width - head - 2)
    out = []
    for part, run in enumerate(runs, start=1):
        title = f"{what_ran} · {caption}\n" if caption else f"{what_ran} · "
        title += f"{what_of(method)} by {x or 'case'}" + (f" ({part}/{len(runs)})" if len(runs) > 1 else "")
        table = Table(
            title=title,
            box=box.SIMPLE_HEAD,
            min_width=min(max(map(len, title.split("\n"))), width),
            pad_edge=False,
            title_justify="left",
        )
        table.add_column(x or "case", justify="left", max_width=head, overflow="fold")
        for i in run:
            table.add_column(str(xs[i]), justify="right", no_wrap=True)
        for n in order:
            table.add_row(n, *[cells.get((n, xs[i]), "") for i in run])
        out.append(table)
    return out


def tables(path: str | Path, errors: bool = True) -> list[Table]:
    return _tables(load_results(path), errors)


def _tables(frame, errors: bool) -> list[Table]:
    """The flat list (``--wide``): one row per case."""
    out = []
    for suite, rows in frame.groupby(col.SUITE, sort=False):
        params = [c for c in parameter_columns(rows.columns) if rows[c].nunique(dropna=True) > 1]
        if rows[col.WORKLOAD].nunique() > 1:  # a suite mixing workloads (smoke)
            params.insert(0, col.WORKLOAD)
        optional = [c for c in optional_columns() if c in rows.columns and rows[c].notna().any()]
        # Which code ran, where the machine decides it: shown where a row says.
        code = [col.CODE_PATH] if col.CODE_PATH in rows.columns and rows[col.CODE_PATH].notna().any() else []
        table = Table(title=f"{suite} ({len(rows)} rows)")
        for column in [
            col.LABEL,
            *params,
            col.METHOD,
            col.DEVICE,
            col.STATUS,
            "peak GiB",
            "median s",
            "IQR s",
            *optional,
            col.TRUST,
            *code,
        ]:
            table.add_column(column, justify="left" if column in _LEFT else "right")
        if errors:
            table.add_column(col.ERROR)
        for _, r in rows.iterrows():
            peak = None if missing(r[col.PEAK_BYTES]) else r[col.PEAK_BYTES] / GIB
            cells = [
                col.legend(r[col.LABEL], r[col.IMPL]),
                *[r[c] for c in params],
                r[col.METHOD],
                r[col.DEVICE],
                r[col.STATUS],
                peak,
                r[col.TIME_MEDIAN_S],
                r[col.TIME_IQR_S],
                *[r[c] for c in optional],
                r[col.TRUST] or "",
                *[r[c] if not missing(r[c]) else "" for c in code],
            ]
            if errors:
                cells.append(str(r[col.ERROR])[:80])
            table.add_row(*[_cell(c) for c in cells])
        out.append(table)
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
            console.print(f"{folder}:", highlight=False, markup=False)
        for table in _tables(frame, errors) if wide else pivot_tables(frame, width or DEFAULT_WIDTH):
            console.print(table)
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    frame.attrs = {key: [d for f in frames for d in f.attrs.get(key, [])] for key in ("dropped", "files")}
    for line in warning_lines(frame, marked=not wide):
        warnings.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)
