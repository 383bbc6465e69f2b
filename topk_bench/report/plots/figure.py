"""Figures like the paper's: metric rows (memory above time) by x-range panels (short lengths left, long right).

One figure per suite CSV and (device, method), saved as
``<suite>-<device>-<method>.<fmt>``. Failed points (OOM, over budget, timeout,
crash) are drawn as a cross on the panel's top edge at their size, the curve
leaving its last measured point towards it, with the status (and the predicted
value when known) written next to it: a curve that simply ends would read as
"not measured". Measured times carry their interquartile range; curves of equal
value are shifted apart a little (dodged) so that none hides another. A memory
panel draws the memory budget the cases ran under when a case went over it or the
curves come near it. A time measured under contention is a hollow marker, on time
panels only (:mod:`topk_bench.report.plots.marks`); the legend explains every
encoding the figure uses. A single x-range with more than two metrics is laid out
as a grid of two columns.

A suite with ``[plot] pareto = true`` also gets a quality-against-time figure,
``<suite>-pareto-<device>-<method>.<fmt>`` (:mod:`topk_bench.report.plots.pareto`); rows with per-stage columns
(implementations that mark stages) a per-stage figure, ``<suite>-stages-<device>-<method>.<fmt>``
(:mod:`topk_bench.report.plots.stages`).

Plug-in renderers (e.g. fidelity against k) take over a suite's figure: either
``register_renderer("suite or workload", fn)`` in code, or
``"renderer": "package.module:function"`` in the suite's ``[plot]`` section
(which the runner copies to meta.json), naming one of this package's
(:data:`INSTALLED_RENDERERS`) or one registered in code under that name: a
results folder may come from anyone, and plot imports nothing it names. A renderer is
``fn(rows: DataFrame, spec: PlotSpec, device: str, method: str) -> Figure``.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from matplotlib.transforms import offset_copy

from topk_bench import fileio, untrusted
from topk_bench.errors import BadInput
from topk_bench.protocol import DEFAULT as DEFAULT_PROTOCOL
from topk_bench.protocol import drawn_metric
from topk_bench.report.plots import marks, pareto, scales
from topk_bench.report.plots import stages as stage_plot
from topk_bench.report.plots.inputs import FigureInput, figure_inputs
from topk_bench.report.plots.series import series, short, styled
from topk_bench.report.plots.spec import MEMORY_CHOICES, PlotSpec, memory_metric
from topk_bench.report.plots.style import (
    FAILURE_MARKER,
    FAILURE_TEXT,
    format_power_of_two,
    format_size,
)
from topk_bench.results import columns as col
from topk_bench.results import trust
from topk_bench.results.columns import metric
from topk_bench.status import Status
from topk_bench.types import Method
from topk_bench.units import GIB, short_bytes, wrap

Renderer = Callable[[pd.DataFrame, PlotSpec, str, str], Figure]
# Suite name or workload -> renderer; the suite name wins.
RENDERERS: dict[str, Renderer] = {}
FORMATS = ("png", "pdf", "svg")
DPI = 110  # committed PNGs stay small and readable


def register_renderer(key: str, renderer: Renderer | None = None):
    """Use ``renderer`` for the suite (or workload) named ``key``; usable as a decorator."""

    def add(fn: Renderer) -> Renderer:
        RENDERERS[key] = fn
        return fn

    return add(renderer) if renderer is not None else add


# What a suite's ``[plot] renderer`` (copied to meta.json) may name beyond what this process registered: this
# package's own renderers. A results folder may come from anyone: plot imports no module its meta.json names.
INSTALLED_RENDERERS = ("topk_bench.report.plots.fidelity:render",)


def _resolve_renderer(spec: PlotSpec) -> Renderer:
    if spec.renderer:
        if spec.renderer in RENDERERS:  # the user's own code registered it under that name
            return RENDERERS[spec.renderer]
        if spec.renderer not in INSTALLED_RENDERERS:
            raise BadInput(
                f"{spec.renderer!r} (in {spec.suite}.meta.json) is neither a renderer of topk-bench "
                f"({', '.join(INSTALLED_RENDERERS)}) nor one registered with register_renderer in this "
                "process: plot runs no code a results folder names",
                key="plot.renderer",
            )
        module, _, name = spec.renderer.partition(":")
        return getattr(importlib.import_module(module), name)
    return RENDERERS.get(spec.suite) or RENDERERS.get(spec.workload) or draw_figure


# --- axes --------------------------------------------------------------------------------------


def _in_panel(xs: pd.Series, panel) -> pd.Series:
    lo, hi = panel
    keep = xs.notna()
    if lo is not None:
        keep &= xs >= lo
    if hi is not None:
        keep &= xs <= hi
    return keep


def _set_x_ticks(ax, xs: np.ndarray, spec: PlotSpec) -> None:
    """Ticks at the measured sizes (thinned when crowded), labelled 1K/64K or 2^9 like the paper."""
    ticks = np.unique(xs[np.isfinite(xs)])
    if not len(ticks):
        return
    while len(ticks) > 7:
        ticks = ticks[::2]
    formatter = format_power_of_two if spec.x == "chunk_size" else format_size
    ax.xaxis.set_major_locator(FixedLocator(ticks.tolist()))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: formatter(v)))
    ax.xaxis.set_minor_locator(NullLocator())


def _dodge(xs: np.ndarray, index: int, count: int, spec: PlotSpec, span: tuple[float, float]) -> np.ndarray:
    """``xs`` shifted a little per curve, so that curves with equal values (top-k on Performer's memory
    at long inputs, the paper's point) stay visible side by side: 3% of a log step apart, or 1% of the panel."""
    offset = index - (count - 1) / 2
    if spec.log_x:
        return xs * float(spec.log_x) ** (0.03 * offset)
    return xs + 0.01 * offset * (span[1] - span[0])


def _failure_text(status: str, value: float, unit: str) -> str:
    """``over budget (36.5 GiB)``: the status and the value in the unit that fits it (not the panel's)."""
    text = FAILURE_TEXT.get(status, str(status))
    if not np.isfinite(value):
        return text
    amount = scales.in_bytes(value, unit)
    written = short_bytes(amount) if amount is not None else f"{value:.3g} {unit}".strip()
    return f"{text} ({written})"


# Where a point beyond the frame is drawn, in axes fractions: on the top edge, above a break in the y axis.
ABOVE = 1.0
# A linear frame is stretched to show an exact value over the budget up to this factor of its top.
STRETCH = 1.3


def _draw_failures(ax, failed: pd.DataFrame, style, unit: str) -> list[tuple]:
    """A cross on the panel's top edge at each failed size, above the break in the y axis: the case went past
    what could be measured (memory, time), so its point lies beyond the frame. No line joins it to the curve
    (one would draw a levelling off that did not happen). Returns (x, text, colour, size) of each cross for
    :func:`_annotate`."""
    notes = []
    for fx, fy, status, size in zip(failed["_dodged"], failed["_y"], failed[col.STATUS], failed["_x"]):
        _cross(ax, fx, ABOVE, style, ax.get_xaxis_transform())
        notes.append((fx, _failure_text(status, fy, unit), style.colour, size))
    return notes


def _cross(ax, x: float, y: float, style, transform) -> None:
    ax.plot(
        [x],
        [y],
        marker=FAILURE_MARKER,
        color=style.colour,
        markersize=8,
        markeredgecolor="black",
        markeredgewidth=0.6,
        linestyle="none",
        zorder=5,
        transform=transform,
        clip_on=False,
    )


def _towards(ax, last_ok, over: pd.DataFrame, style) -> None:
    """A dotted line from the last point within the budget towards the first one over it, at its value: clipped
    by the frame when that value lies above it, so that it leaves the frame as steeply as the curve rises."""
    if last_ok is None or not len(over):
        return
    ax.plot(
        [last_ok[0], over["_dodged"].iloc[0]],
        [last_ok[1], over["_y"].iloc[0]],
        linestyle=":",
        color=style.colour,
        linewidth=1,
        zorder=4,
        scalex=False,
        scaley=False,  # the frame is the curves': a value far above it must not squash them
    )


def _break_marks(ax) -> None:
    """Two short slanted strokes across the left spine below the top edge: the y axis is broken there, and what
    sits on the edge lies beyond it, at the value written beside it."""
    for dy in (0.0, 0.022):
        ax.plot(
            [-0.012, 0.012],
            [0.925 + dy, 0.945 + dy],
            transform=ax.transAxes,
            color="black",
            linewidth=0.9,
            clip_on=False,
            zorder=6,
        )


def _draw_predicted_over(ax, over: pd.DataFrame, last_ok, style, unit: str, middle: float) -> None:
    """A predicted peak over the budget is exact: its cross is drawn at its value (above the budget line),
    labelled, the curve leaving its last point within the budget towards it with a dotted line."""
    for fx, fy in zip(over["_dodged"], over["_y"]):
        _cross(ax, fx, fy, style, ax.transData)
        left = fx < middle
        ax.annotate(
            _failure_text(Status.OVER_BUDGET, fy, unit),
            (fx, fy),
            textcoords="offset points",
            xytext=(7 if left else -7, 0),
            ha="left" if left else "right",
            va="center",
            fontsize=7,
            color=style.colour,
            zorder=6,
            bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85),
        )
    _towards(ax, last_ok, over, style)


def _annotate(ax, notes: list[tuple], middle: float) -> None:
    """Each cross labelled with its status (and value when known), stacked downwards from the top edge
    where several curves fail at the same size."""
    top = ax.get_xaxis_transform()
    by_x: dict[float, list[tuple]] = {}
    for note in sorted(notes, key=lambda n: n[0]):
        by_x.setdefault(note[3], []).append(note)  # by the size itself: the crosses are dodged apart
    for group in by_x.values():
        for row, (fx, text, colour, _) in enumerate(group):
            left = fx < middle  # text grows towards the inside of the panel, never past its frame
            ax.annotate(
                text,
                (fx, ABOVE),
                xycoords=top,
                textcoords="offset points",
                xytext=(6 if left else -6, -6 - 10 * row),
                ha="left" if left else "right",
                va="top",
                fontsize=7,
                color=colour,
                zorder=6,
                # a light backing keeps the text legible where it crosses another curve
                bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85),
            )


def _quartiles(cells: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(q1, q3) of each ``times_s`` cell; NaN where it holds fewer than two samples. The cells of one sample
    count at once (one ``np.percentile`` over their rows, not one a cell: 100,000 cells took seconds)."""
    samples = [[float(t) for t in str(c).split(";") if t.strip()] if isinstance(c, str) else [] for c in cells]
    q1, q3 = np.full(len(samples), np.nan), np.full(len(samples), np.nan)
    by_count: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        if len(s) >= 2:
            by_count.setdefault(len(s), []).append(i)
    for where in by_count.values():
        q1[where], q3[where] = np.percentile(np.array([samples[i] for i in where]), [25, 75], axis=1)
    return q1, q3


def _draw_metric(ax, curves, spec: PlotSpec, metric_name: str, panel, fit: tuple | None = None) -> set[str]:
    """Draw one metric in one panel: a line per curve, IQR bars on measured times, crosses where curves stop,
    the memory budget where it matters; ``fit``: the metric in the unit its row is drawn in, and the factor to
    it (:func:`topk_bench.report.plots.scales.fitted`). Returns the encodings it used (the legend explains them)."""
    m, factor = fit or (metric(metric_name), 1.0)
    all_x, notes, used = [], [], set()
    budget = _budget_gib(pd.concat([r for _, _, r in curves]) if curves else None, m, panel, spec)
    in_panel = [pd.to_numeric(r[spec.x], errors="coerce") for _, _, r in curves]
    xs = np.concatenate([x[_in_panel(x, panel)].to_numpy(float) for x in in_panel]) if curves else np.array([])
    span = (float(xs.min()), float(xs.max())) if len(xs) else (0.0, 1.0)
    middle = (
        np.nan
        if not len(xs)
        else (np.sqrt(xs.min() * xs.max()) if spec.log_x and xs.min() > 0 else (xs.min() + xs.max()) / 2)
    )
    drawn: list[tuple[str, np.ndarray, set]] = []  # (legend, its points, its artists): which curves would hide others
    beyond: list[tuple] = []  # (rows over the budget, last ok point, style): exact values, placed once limits are set
    for index, (legend, style, rows) in enumerate(curves):
        # Columns are added before filtering: assigning to an empty frame would add rows.
        x = pd.to_numeric(rows[spec.x], errors="coerce")
        rows = rows.assign(
            _x=x,
            _dodged=_dodge(x.to_numpy(float), index, len(curves), spec, span),
            _y=marks.values(rows, metric_name) * factor,
        )
        rows = rows[_in_panel(rows["_x"], panel)].sort_values("_x")
        ok = rows[(rows[col.STATUS] == Status.OK) & rows["_y"].notna()]
        if len(ok):
            before = set(ax.get_children())
            # Hollow only where the value comes from the clock: a peak is exact whatever the load.
            hollow = marks.contended(ok) & m.timed
            marks.curve(ax, ok["_dodged"], ok["_y"], style, legend, hollow)
            if hollow.any():
                used.add(marks.HOLLOW_LEGEND)
            if m.column == col.TIME_MEDIAN_S and col.TIMES_S in ok and _iqr_bars(ax, ok, m, style):
                used.add(marks.IQR_LEGEND)
            drawn.append((legend, ok[["_dodged", "_y"]].to_numpy(float), set(ax.get_children()) - before))
        failed = rows[rows[col.STATUS].isin(marks.STOPPED)]
        if len(failed):
            before = ok[ok["_x"] < failed["_x"].iloc[0]]
            last_ok = (before["_dodged"].iloc[-1], before["_y"].iloc[-1]) if len(before) else None
            exact = _predicted_over(failed, m)
            if exact.any():
                beyond.append((failed[exact], last_ok, style))
            if not exact.all():
                notes += _draw_failures(ax, failed[~exact], style, m.unit)
                used.add(_cross_legend(failed[~exact]))
        all_x.extend(rows["_x"].tolist())
    if budget is not None:
        ax.axhline(budget * factor, **_BUDGET_LINE)
        used.add(_budget_legend(budget))
    if spec.log_x:
        ax.set_xscale("log", base=spec.log_x)
    if spec.log_y:
        ax.set_yscale("log")
    ax.margins(x=0.06, y=0.08)
    top = ax.get_ylim()[1]
    far: list[tuple] = []
    for over, last_ok, style in beyond:
        # At its value where the frame can show it: on a log axis (which stretches to it without squashing the
        # curves), or a little above the frame's top (stretched by STRETCH at most); else beyond the frame, on its
        # top edge, its value written, the curve leaving the frame towards it.
        if spec.log_y or (over["_y"] <= STRETCH * top).all():
            _draw_predicted_over(ax, over, last_ok, style, m.unit, middle)
            used.add(PREDICTED_OVER_LEGEND)
        else:
            notes += _draw_failures(ax, over, style, m.unit)
            used.add(_cross_legend(over))
            far.append((over, last_ok, style))
    if notes:  # the crosses sit on the top edge, beyond a break in the axis: keep the curves below the break
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.12 * (high - low)) if not spec.log_y else ax.set_ylim(low, high * 2)
        _break_marks(ax)
    for over, last_ok, style in far:
        _towards(ax, last_ok, over, style)
    _annotate(ax, notes, middle)
    _set_x_ticks(ax, np.asarray(all_x, float), spec)
    if spec.log_y:
        scales.plain_log_ticks(ax.yaxis)
    ax.grid(True, which="major", alpha=0.3)
    used |= _set_apart(ax, drawn, m.label.split(" (")[0])
    return used


# A curve whose markers would sit on an earlier curve's (closer than this share of a marker, the panel's limits
# final) at more than half of their common sizes, two at least, is drawn SAME_OFFSET_PT points to the right; where
# it would sit on it at every common size, the two coincide and the legend says so.
SAME_CLOSER = 0.6
SAME_OFFSET_PT = 5.0
SAME_LEGEND = "the same"


def _set_apart(ax, drawn: list[tuple[str, np.ndarray, set]], what: str) -> set[str]:
    """Each curve that would hide an earlier one shifted beside it; the legend entry naming, per set of curves
    that coincide, which do (``what``: the panel's quantity)."""
    size_px = marks.MARKER_SIZE * ax.figure.dpi / 72
    groups: list[list[str]] = []
    placed: list[tuple[str, np.ndarray]] = []
    for legend, points, artists in drawn:
        shown = ax.transData.transform(points)
        shown = shown[np.all(np.isfinite(shown), axis=1)]
        for other, theirs in placed:
            if not len(shown) or not len(theirs):
                continue
            # Every marker against every marker of the earlier curve at once (a figure of 200 curves of 100 sizes
            # is 20,000 pairs): the markers at a size the other curve has, and how many of them sit on one of its.
            apart = shown[:, None, :] - theirs[None, :, :]
            common = np.abs(apart[..., 0]).min(axis=1) < size_px  # the same size
            near = int((np.hypot(apart[..., 0], apart[..., 1]).min(axis=1)[common] < SAME_CLOSER * size_px).sum())
            if common.sum() >= 2 and near > common.sum() / 2:
                shift = offset_copy(ax.transData, ax.figure, x=SAME_OFFSET_PT, units="points")
                for artist in artists:
                    artist.set_transform(shift)
                if near == common.sum():
                    group = next((g for g in groups if other in g), None)
                    if group is None:
                        groups.append([other, legend])
                    else:
                        group.append(legend)
                break
        placed.append((legend, shown))
    return {"\t".join((SAME_LEGEND, what, *g)) for g in groups}  # worded by _same_entries, once per set


STOPPED_LEGEND = "stopped: beyond the frame, on its top edge (reason written)"
PREDICTED_TIME = "time_predicted"  # the metric of a predicted time (columns.METRICS)
PREDICTED_OVER_LEGEND = "predicted over the memory budget: drawn at its exact peak"
_CROSSES = ("stopped:", "over the memory budget", PREDICTED_OVER_LEGEND)


def _cross_legend(failed: pd.DataFrame) -> str:
    """What the crosses on the top edge mean: cases over the memory budget (named) when that is all, else
    cases that stopped, each cross saying why."""
    if set(failed[col.STATUS]) != {Status.OVER_BUDGET}:
        return STOPPED_LEGEND
    budgets = pd.to_numeric(failed.get(col.MAX_MEMORY_BYTES, pd.Series(dtype=float)), errors="coerce").dropna().unique()
    named = f" ({budgets[0] / GIB:.3g} GiB)" if len(budgets) == 1 else ""
    return f"over the memory budget{named}: beyond the frame, on its top edge (its peak written)"


def _predicted_over(failed: pd.DataFrame, m) -> pd.Series:
    """The stopped rows whose value is exact and drawn where it is: predicted peaks over the budget."""
    return (
        (failed[col.METHOD] == Method.PREDICTED)
        & (failed[col.STATUS] == Status.OVER_BUDGET)
        & failed["_y"].notna()
        & (not m.timed)
    )


def _iqr_bars(ax, ok: pd.DataFrame, m, style) -> bool:
    """Interquartile range bars on measured times; whether any point has one (two samples or more)."""
    q1, q3 = _quartiles(ok[col.TIMES_S])
    low = (ok["_y"] - q1 * m.scale).clip(lower=0)
    high = (q3 * m.scale - ok["_y"]).clip(lower=0)
    ax.errorbar(
        ok["_dodged"],
        ok["_y"],
        yerr=[low.fillna(0), high.fillna(0)],
        fmt="none",
        ecolor=style.colour,
        elinewidth=1,
        capsize=2,
        alpha=0.8,
    )
    return bool(np.isfinite(q1).any())


_BUDGET_LINE: dict[str, Any] = dict(color="0.35", linestyle="-.", linewidth=1, zorder=1)


def _budget_legend(gib: float) -> str:
    return f"dash-dot: the memory budget ({gib:.3g} GiB)"


def _budget_gib(rows: pd.DataFrame | None, m, panel, spec: PlotSpec) -> float | None:
    """The memory budget the panel's cases ran under, in GiB, on a panel of total peaks, when it can be drawn
    without squashing the curves: a peak reaches half of it, or the axis is logarithmic and a case went over it.
    (Elsewhere a case over it is a cross on the top edge, the legend naming the budget.)"""
    if (
        rows is None
        or m.minus
        or m.column not in (col.PEAK_BYTES, col.RESERVED_BYTES)
        or col.MAX_MEMORY_BYTES not in rows
    ):
        return None
    rows = rows[_in_panel(pd.to_numeric(rows[spec.x], errors="coerce"), panel)]
    budgets = pd.to_numeric(rows[col.MAX_MEMORY_BYTES], errors="coerce").dropna().unique()
    if len(budgets) != 1:
        return None
    gib = float(budgets[0]) / GIB
    peaks = marks.values(rows[rows[col.STATUS] == Status.OK], m.name)
    over = (rows[col.STATUS] == Status.OVER_BUDGET).any()
    return gib if (over and spec.log_y) or (peaks.notna().any() and peaks.max() >= 0.5 * gib) else None


def _has_values(rows: pd.DataFrame, metric_name: str) -> bool:
    return bool(marks.values(rows, metric_name).notna().any())


def _title(spec: PlotSpec, rows: pd.DataFrame, device: str, method: str, width_in: float, memory: str) -> str:
    """Suite title wrapped to the figure's width, then how the numbers were obtained (``memory``: the memory
    metric drawn, :func:`~topk_bench.report.plots.spec.memory_metric`)."""
    held = "reserved bytes (the caching allocator simulated)" if memory == "reserved" else "allocated bytes"
    if method == Method.PREDICTED and _has_values(rows, PREDICTED_TIME):
        timed = rows[marks.values(rows, PREDICTED_TIME).notna()]  # a failed case's row may name no part
        names = sorted(set(timed[col.DEVICE_NAME].dropna().astype(str)) - {""})
        gpu = names[0].split(" (")[0] if len(names) == 1 else device  # the product, not "(h100-sxm, predicted)"
        how = f"predicted for {gpu}: {held}, time by the kernel time model"
    elif method == Method.PREDICTED:
        how = f"predicted: {held}, nothing computed"
    else:
        names = sorted(set(rows[col.DEVICE_NAME].dropna().astype(str)) - {""})
        how = f"measured on {names[0] if len(names) == 1 else device}"
    title = scales.filled(spec.title, rows)
    if spec.split:  # one figure per value: say which
        title += " — " + ", ".join(f"{c} {short(rows[c].iloc[0])}" for c in spec.split if c in rows and len(rows))
    if spec.protocol != DEFAULT_PROTOCOL:
        how += f"; {spec.protocol} protocol"
    # The files' text drawn as it is (no mathtext), each line on its own: the line breaks are the layout's.
    return "\n".join([*wrap(untrusted.figure(title), int(width_in * 11)), untrusted.figure(how)])


def _panels_with_data(rows: pd.DataFrame, spec: PlotSpec, metrics: list[str]):
    """The spec's panels that hold a measured value: a run at reduced scale (CPU) leaves the long-length panel empty."""
    ok = rows[rows[col.STATUS] == Status.OK]
    xs = pd.to_numeric(ok[spec.x], errors="coerce")
    has_value = pd.concat([marks.values(ok, m).notna() for m in metrics], axis=1)
    xs = xs[has_value.any(axis=1)]
    kept = tuple(p for p in spec.panels if _in_panel(xs, p).any())
    return kept or spec.panels


def _grid(metrics: list[str], panels) -> tuple[int, int, list[tuple[str, tuple, int, int]]]:
    """(rows, columns, cells): a row per metric and a column per x-range; one x-range and more than two
    metrics: two columns, so that a figure of many metrics is not one tall column."""
    if len(panels) == 1 and len(metrics) > 2:
        return math.ceil(len(metrics) / 2), 2, [(m, panels[0], i // 2, i % 2) for i, m in enumerate(metrics)]
    return len(metrics), len(panels), [(m, p, r, c) for r, m in enumerate(metrics) for c, p in enumerate(panels)]


def draw_figure(rows: pd.DataFrame, spec: PlotSpec, device: str, method: str) -> Figure:
    """The default renderer: a panel per metric that has values and x-range of spec.panels (:func:`_grid`)."""
    # The protocol's own statistics: the paper's time is a mean, its measured CUDA memory reserved bytes;
    # otherwise "memory" is the allocated or reserved peak, as the spec asks.
    memory = memory_metric(spec, rows)
    metrics = [drawn_metric(m, spec.protocol, device, method) for m in spec.metrics]
    if method == Method.PREDICTED:  # a CUDA prediction's time is the time model's (topk_bench.predict.timing)
        metrics = [PREDICTED_TIME if m in ("time", "time_mean") else m for m in metrics]
    metrics = [memory if m == "memory" else m for m in metrics]
    metrics = [m for m in metrics if _has_values(rows, m)] or [metrics[0]]
    curves = styled(series(rows, spec))
    panels = _panels_with_data(rows, spec, metrics)
    nrows, ncols, cells = _grid(metrics, panels)
    width = max(4.3 * ncols + 0.6, 6.4)  # a single panel still needs room for title and legend
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 2.9 * nrows + 1.3), squeeze=False, layout="constrained")
    used: set[str] = set()
    ok = rows[rows[col.STATUS] == Status.OK]
    # One unit per metric: the panels of a row share its label.
    fits = {name: scales.fitted(metric(name), marks.values(ok, name).to_numpy(float)) for name in metrics}
    for metric_name, panel, r, c in cells:
        ax = axes[r][c]
        used |= _draw_metric(ax, curves, spec, metric_name, panel, fits[metric_name])
        if c == 0 or ncols > len(panels):  # a grid of metrics: each panel is a metric of its own
            ax.set_ylabel(fits[metric_name][0].label)
        if not any(rr == r + 1 and cc == c for _, _, rr, cc in cells):
            ax.set_xlabel(untrusted.figure(scales.filled(spec.x_label, rows)))
    for r, c in {(r, c) for r in range(nrows) for c in range(ncols)} - {(r, c) for _, _, r, c in cells}:
        fig.delaxes(axes[r][c])
    legend_in = marks.fitted_legend(fig, *_legend_entries(axes, rows, used), width)
    fig.suptitle(_title(spec, rows, device, method, width, memory), fontsize=10)
    # Room for the legend's lines below the panels, so that they keep their height (and their labels apart).
    fig.set_size_inches(width, 2.9 * nrows + 1.0 + legend_in)
    return fig


def _same_entries(notes) -> list[str]:
    """One legend entry per set of curves that coincide, naming the quantities in which they do. Coinciding is a
    matter of the frame's scale (a marker's width), not of the values: 56 and 90 MiB sit on one point of a frame
    of 10 GiB, so the entry says they cannot be told apart there, never that they are the same."""
    quantities: dict[tuple[str, ...], list[str]] = {}
    for note in sorted(notes):
        _, what, *names = note.split("\t")
        quantities.setdefault(tuple(names), []).append(what)
    return [
        f"{', '.join(names)}: {' and '.join(dict.fromkeys(whats))} too close to tell apart at this scale "
        "(drawn side by side)"
        for names, whats in quantities.items()
    ]


def _legend_entries(axes, rows: pd.DataFrame, used: set[str]) -> tuple[list[object], list[str]]:
    """One entry per curve (first occurrence across panels), then one per other encoding the panels used
    (hollow markers, IQR bars, the budget line, the failure cross), and what no curve shows."""
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if marks.HOLLOW_LEGEND in used:
        seen[marks.HOLLOW_LEGEND] = marks.hollow_handle()
    if marks.IQR_LEGEND in used:
        seen[marks.IQR_LEGEND] = marks.iqr_handle()
    for entry in sorted(u for u in used if u.startswith("dash-dot")):
        seen[entry] = Line2D([], [], **_BUDGET_LINE)
    for entry in sorted(u for u in used if u.startswith(_CROSSES)):
        seen[entry] = marks.cross_handle()
    for entry in _same_entries(u for u in used if u.startswith(SAME_LEGEND)):
        seen[entry] = marks.text_handle()
    for note in marks.not_shown(rows):  # entries of their own (no marker), not a heading over the legend
        seen[f"not shown: {note}"] = marks.text_handle()
    return list(seen.values()), list(seen.keys())


# --- files -------------------------------------------------------------------------------------


def parse_formats(text: str) -> tuple[str, ...]:
    formats = tuple(f.strip().lower().lstrip(".") for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if not formats or bad:
        raise BadInput(f"expected a comma-separated list of {', '.join(FORMATS)}, got {text!r}", key="--format")
    return formats


class NotDrawn(Exception):
    """Figures that could not be drawn (``failures``: one line each, naming it); the others were (``written``)."""

    def __init__(self, written: list[Path], failures: list[str]):
        self.written, self.failures = written, failures
        super().__init__("; ".join(failures))


def render(item: FigureInput, out_dir: Path, formats: tuple[str, ...], failures: list[str] | None = None) -> list[Path]:
    """The item's figure, and its quality-against-time figure where the suite asks for one, in ``out_dir``'s
    sub-folder of the item. ``failures``: where a figure that cannot be drawn says so in one line (a renderer
    that raises, text matplotlib cannot lay out), the other figures drawn; without it, it raises. Bad input and
    a file that cannot be written (exit 2) always raise."""
    out_dir = out_dir / item.folder
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = [
        (out_dir / item.stem, lambda: _resolve_renderer(item.spec)(item.rows, item.spec, item.device, item.method))
    ]
    if pareto.wanted(item.spec, item.rows, item.method):
        figures.append(
            (out_dir / item.named("pareto"), lambda: pareto.draw(item.rows, item.spec, item.device, item.method))
        )
    if stage_plot.wanted(item.rows):
        figures.append(
            (out_dir / item.named("stages"), lambda: stage_plot.draw(item.rows, item.spec, item.device, item.method))
        )
    paths = []
    for stem, draw in figures:
        try:
            paths += _save(draw(), stem, formats)
        except (BadInput, OSError):
            raise
        except Exception as exc:  # any other failure to draw one figure is its one line
            if failures is None:
                raise
            plt.close("all")
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            failures.append(untrusted.shown(f"{stem}: not drawn: {type(exc).__name__}: {why}"))
    return paths


def _save(fig: Figure, stem: Path, formats: tuple[str, ...]) -> list[Path]:
    try:
        paths = []
        for fmt in formats:
            path = stem.with_name(f"{stem.name}.{fmt}")
            buffer = io.BytesIO()
            fig.savefig(buffer, format=fmt, dpi=DPI)
            fileio.write_atomic(path, buffer.getvalue())  # a full disk leaves no half figure
            paths.append(path)
        return paths
    finally:
        plt.close(fig)


def plot_results(
    results: str | Path,
    out_dir: str | Path = "plots",
    formats: tuple[str, ...] = ("png",),
    warn: Callable[[str], None] | None = None,
    memory: str | None = None,
) -> list[Path]:
    """Render every suite CSV of ``results`` into ``out_dir``; returns the files written.

    ``warn`` hears of every line of the CSVs left out, and of each figure that cannot draw the ``memory``
    asked for (``allocated`` or ``reserved``, instead of each suite's ``[plot] memory``). A figure that cannot be
    drawn does not stop the others: :class:`NotDrawn`, raised at the end, names each and lists what was written.
    """
    if memory is not None and memory not in MEMORY_CHOICES:
        raise BadInput(f"expected one of {', '.join(MEMORY_CHOICES)}, got {memory!r}", key="--memory")
    inputs = figure_inputs(Path(results), warn)  # validates everything before writing anything
    if memory is not None:
        inputs = [dataclasses.replace(i, spec=dataclasses.replace(i.spec, memory=memory)) for i in inputs]
        for item in inputs:
            if warn and memory == "reserved" and memory_metric(item.spec, item.rows) != "reserved":
                warn(
                    f"{item.stem}: not every measured point has reserved_bytes (only CUDA has them): "
                    "its memory row draws the allocated peak"
                )
    for item in inputs:
        _resolve_renderer(item.spec)  # an unknown one is bad input before any file is written
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput("expected a directory, got a file", file=out, key="--out")
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    written = [path for item in inputs for path in render(item, out, formats, failures)]
    measured = [item.rows.loc[item.rows[col.METHOD] == Method.MEASURED, col.TRUST] for item in inputs]
    runs = [run for item in inputs for run in item.runs]
    flagged = trust.warning(pd.concat(measured), list(dict.fromkeys(runs))) if measured else None
    if flagged and warn:
        warn(flagged + " (hollow markers)")
    if failures:
        raise NotDrawn(written, failures)
    return written
