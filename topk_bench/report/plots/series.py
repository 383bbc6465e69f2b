"""The curves of a figure: its rows grouped by legend, and each curve's style."""

from __future__ import annotations

import numpy as np
import pandas as pd

from topk_bench.report.plots.palette import impl_rank, series_style
from topk_bench.report.plots.spec import PlotSpec
from topk_bench.report.plots.style import format_size
from topk_bench.results import columns as col
from topk_bench.results.columns import parameter_columns


def series(rows: pd.DataFrame, spec: PlotSpec) -> list[tuple[str, str, pd.DataFrame]]:
    """(legend, impl, rows) per curve: by label, split further by any other parameter that varies inside it."""
    x = spec.x
    rows = rows.assign(label=col.legends(rows))
    parameters = spec.parameters if spec.parameters is not None else parameter_columns(rows.columns)
    others = [c for c in parameters if c != x and c in rows.columns]
    out = []
    for label, group in rows.groupby(col.LABEL, sort=False):
        # A parameter with one value per x moves with x (the option a swept token budget sets): not a curve of its own.
        varying = [
            c
            for c in others
            if group[c].nunique(dropna=True) > 1 and group.groupby(x, dropna=False)[c].nunique(dropna=True).max() > 1
        ]
        if not varying:
            out.append((str(label), str(group[col.IMPL].iloc[0]), group))
            continue
        for values, sub in group.groupby(varying, sort=True, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            suffix = ", ".join(f"{c}={short(v)}" for c, v in zip(varying, values))
            out.append((f"{label} ({suffix})", str(sub[col.IMPL].iloc[0]), sub))
    # A case re-measured after a code change has a new case_id and a second row: the last one wins.
    out = [(legend, impl, group.drop_duplicates(subset=[x], keep="last")) for legend, impl, group in out]
    return sorted(out, key=lambda item: (impl_rank(item[1]), item[0]))


def styled(series):
    """(legend, style, rows): the n-th curve of an implementation keeps its colour and marker, changes dashes."""
    seen: dict[str, int] = {}
    out = []
    for legend, impl, rows in series:
        out.append((legend, series_style(impl, seen.get(impl, 0)), rows))
        seen[impl] = seen.get(impl, 0) + 1
    return out


def short(value) -> str:
    if isinstance(value, np.number):
        value = value.item()  # the Python number format_size takes
    return format_size(value) if isinstance(value, (int, float)) and not pd.isna(value) else str(value)
