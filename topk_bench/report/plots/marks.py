"""Marks every figure draws alike: a curve's points, hollow where a time was measured under contention, and
the legend entries that explain each encoding a figure uses.

One meaning per encoding (:mod:`topk_bench.report.plots.style`): a hollow marker is a
time measured under contention (the row's ``trust`` flag, :mod:`topk_bench.results.trust`),
and only on a panel whose values come from the clock (time, time per token, rates): a
memory peak or a quality is exact whatever the load, so it stays filled.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from topk_bench.report.plots.palette import HANDLE_LENGTH, SeriesStyle
from topk_bench.report.plots.style import FAILURE_MARKER, FAILURE_TEXT
from topk_bench.results import columns as col
from topk_bench.results.columns import metric
from topk_bench.status import Status
from topk_bench.types import Method
from topk_bench.units import wrap
from topk_bench.untrusted import abridged, figure

STOPPED = tuple(FAILURE_TEXT)  # statuses drawn as a cross
MARKER_SIZE = 6
HOLLOW_LEGEND = "hollow: time measured under contention (column trust)"
IQR_LEGEND = "bars: interquartile range of the timed samples"


def values(rows: pd.DataFrame, name: str) -> pd.Series:
    """A metric's values in its unit (NaN where a column is empty or absent)."""
    m = metric(name)
    if any(c not in rows for c in m.columns):
        return pd.Series(np.nan, index=rows.index)
    out = pd.to_numeric(rows[m.column], errors="coerce")
    if m.minus:
        out = out - pd.to_numeric(rows[m.minus], errors="coerce")
    return out * m.scale


def contended(rows: pd.DataFrame) -> pd.Series:
    """Measured rows whose trust flag is set (:mod:`topk_bench.results.trust`)."""
    flags = rows[col.TRUST].fillna("") if col.TRUST in rows.columns else pd.Series("", index=rows.index)
    return (rows[col.METHOD] == Method.MEASURED) & (flags != "")


def curve(ax, xs, ys, style: SeriesStyle, legend: str | None, hollow) -> Line2D:
    """A line through (``xs``, ``ys``) in the implementation's style, markers filled; then the points where
    ``hollow`` (booleans) is true drawn again, hollow. Returns the line (its data are the points drawn)."""
    xs, ys, hollow = np.asarray(xs, float), np.asarray(ys, float), np.asarray(hollow, bool)
    (line,) = ax.plot(
        xs,
        ys,
        color=style.colour,
        marker=style.marker,
        markersize=MARKER_SIZE,
        linewidth=1.6,
        label=legend,
        markeredgewidth=1.2,
    )
    if style.dashes:
        line.set_dashes(style.dashes)
    if hollow.any():
        ax.plot(
            xs[hollow],
            ys[hollow],
            marker=style.marker,
            markersize=MARKER_SIZE,
            linestyle="none",
            markerfacecolor="white",
            markeredgecolor=style.colour,
            markeredgewidth=1.2,
            zorder=4,
        )
    return line


def hollow_handle() -> Line2D:
    return Line2D([], [], marker="o", color="0.4", markerfacecolor="white", linestyle="none", markersize=MARKER_SIZE)


def iqr_handle() -> Line2D:
    return Line2D([], [], marker="|", color="0.4", linestyle="none", markersize=10, markeredgewidth=1)


def cross_handle() -> Line2D:
    return Line2D([], [], marker=FAILURE_MARKER, color="0.4", markeredgecolor="black", linestyle="none", markersize=8)


def text_handle() -> Line2D:
    """An entry with no mark: a note."""
    return Line2D([], [], linestyle="none")


def stopping(rows: pd.DataFrame) -> str:
    """How the figure's stopped cases stopped, in words: "went over the memory budget" when that is all."""
    stopped = set(rows.loc[rows[col.STATUS].isin(STOPPED), col.STATUS])
    return "went over the memory budget" if stopped == {Status.OVER_BUDGET} else "stopped"


def not_shown(rows: pd.DataFrame) -> list[str]:
    """What the curves cannot show: implementations that did not run at all, and skipped cases."""
    labels = pd.Series(col.legends(rows), index=rows.index)
    notes = []
    unsupported = sorted(set(labels[rows[col.STATUS] == Status.UNSUPPORTED]))
    if unsupported:
        notes.append("unsupported: " + ", ".join(unsupported))
    never_ok = sorted(set(labels[rows[col.STATUS].isin(STOPPED)]) - set(labels[rows[col.STATUS] == Status.OK]))
    if never_ok:
        notes.append("stopped at every size: " + ", ".join(never_ok))
    skipped = int((rows[col.STATUS] == Status.SKIPPED).sum())
    if skipped:
        notes.append(f"{skipped} larger case(s), not run after a smaller one {stopping(rows)}")
    return notes


# A legend entry at 8 pt: about 0.075 in per character, plus the marker and its gap.
_CHAR_IN, _MARK_IN, _WIDEST_COUNTED = 0.075, 0.85, 32
# A legend entry shows at most this many characters of a label (a few lines), however long the label is.
_LONGEST_LABEL = 240


def fitted_legend(fig, handles: list, labels: list[str], width_in: float) -> float:
    """The figure's legend below its panels: as many columns as the entries fit (counting at most 32 characters
    of each, so that one long note does not leave the curves in one column), longer labels wrapped to the
    column's width. Returns the legend's height in inches (about), for the figure's size. Labels are data (a
    results file's): drawn as they are, no mathtext (:func:`topk_bench.untrusted.figure`)."""
    labels = [figure(abridged(label, _LONGEST_LABEL)) for label in labels]
    widest = min(max((len(label) for label in labels), default=1), _WIDEST_COUNTED)
    ncol = max(1, min(len(labels), int(width_in // (widest * _CHAR_IN + _MARK_IN))))
    chars = int((width_in / ncol - _MARK_IN) / _CHAR_IN)
    wrapped = ["\n".join(wrap(label, chars)) or label for label in labels]
    fig.legend(
        handles,
        wrapped,
        loc="outside lower center",
        ncol=ncol,
        fontsize=8,
        frameon=False,
        handlelength=HANDLE_LENGTH,  # long enough to draw a variant's dashes
    )
    rows = math.ceil(len(wrapped) / ncol) + sum(label.count("\n") for label in wrapped)
    return 0.19 * rows
