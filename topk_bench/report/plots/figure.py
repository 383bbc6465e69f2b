"""Figures like the paper's: metric rows (memory above time) by x-range panels (short lengths left, long right).

One figure per suite CSV and (device, method), saved as
``<suite>-<device>-<method>.<fmt>``. Failed points (OOM, over budget, timeout,
crash) are drawn as a cross on the panel's top edge at their size, the curve
leaving its last measured point towards it, with the status (and the predicted
value when known) written next to it: a curve that simply ends would read as
"not measured". Measured times carry their interquartile range; curves of equal
value are shifted apart a little (dodged) so that none hides another.

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
import textwrap
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from topk_bench import fileio  # noqa: E402
from topk_bench.errors import BadInput  # noqa: E402
from topk_bench.protocol import DEFAULT as DEFAULT_PROTOCOL, drawn_metric  # noqa: E402
from topk_bench.report.plots.inputs import FigureInput, figure_inputs  # noqa: E402
from topk_bench.report.plots.spec import MEMORY_CHOICES, PlotSpec, memory_metric  # noqa: E402
from topk_bench.report.plots.style import (  # noqa: E402
    FAILURE_MARKER, FAILURE_TEXT, format_power_of_two, format_size, impl_rank, series_style,
)
from topk_bench.results import trust  # noqa: E402
from topk_bench.results.columns import metric, parameter_columns  # noqa: E402
from topk_bench.status import Status  # noqa: E402
from topk_bench.results import columns as col
from topk_bench.types import Method

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
            raise BadInput(f"{spec.renderer!r} (in {spec.suite}.meta.json) is neither a renderer of topk-bench "
                           f"({', '.join(INSTALLED_RENDERERS)}) nor one registered with register_renderer in this "
                           "process: plot runs no code a results folder names", key="plot.renderer")
        module, _, name = spec.renderer.partition(":")
        return getattr(importlib.import_module(module), name)
    return RENDERERS.get(spec.suite) or RENDERERS.get(spec.workload) or draw_figure


# --- series ------------------------------------------------------------------------------------

_STOPPED = tuple(FAILURE_TEXT)  # statuses drawn as a cross


def _series(rows: pd.DataFrame, spec: PlotSpec) -> list[tuple[str, str, pd.DataFrame]]:
    """(legend, impl, rows) per curve: by label, split further by any other parameter that varies inside it."""
    x = spec.x
    rows = rows.assign(label=col.legends(rows))
    parameters = spec.parameters if spec.parameters is not None else parameter_columns(rows.columns)
    others = [c for c in parameters if c != x and c in rows.columns]
    out = []
    for label, group in rows.groupby(col.LABEL, sort=False):
        # A parameter with one value per x moves with x (the option a swept token budget sets): not a curve of its own.
        varying = [c for c in others if group[c].nunique(dropna=True) > 1
                   and group.groupby(x, dropna=False)[c].nunique(dropna=True).max() > 1]
        if not varying:
            out.append((str(label), str(group[col.IMPL].iloc[0]), group))
            continue
        for values, sub in group.groupby(varying, sort=True, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            suffix = ", ".join(f"{c}={_short(v)}" for c, v in zip(varying, values))
            out.append((f"{label} ({suffix})", str(sub[col.IMPL].iloc[0]), sub))
    # A case re-measured after a code change has a new case_id and a second row: the last one wins.
    out = [(legend, impl, group.drop_duplicates(subset=[x], keep="last")) for legend, impl, group in out]
    return sorted(out, key=lambda item: (impl_rank(item[1]), item[0]))


def _styled(series, predicted: bool):
    """(legend, style, rows): the n-th curve of an implementation keeps its colour and marker, changes dashes."""
    seen: dict[str, int] = {}
    out = []
    for legend, impl, rows in series:
        out.append((legend, series_style(impl, seen.get(impl, 0), predicted), rows))
        seen[impl] = seen.get(impl, 0) + 1
    return out


def _short(value) -> str:
    return format_size(value) if isinstance(value, (int, float, np.number)) and not pd.isna(value) else str(value)


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
    ax.xaxis.set_major_locator(FixedLocator(ticks))
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
    text = FAILURE_TEXT.get(status, str(status))
    return f"{text} ({value:.3g} {unit})".replace(" )", ")") if np.isfinite(value) else text


def _draw_failures(ax, failed: pd.DataFrame, last_ok, style, unit: str) -> list[tuple]:
    """A cross on the panel's top edge at each failed size: the case went past what could be measured
    (memory, time), so its point lies above the frame, not on it. A dotted line leaves the last measured
    point towards it. Returns (x, text, colour) of each cross for :func:`_annotate`."""
    top = ax.get_xaxis_transform()  # x in data, y in axes fractions: 1.0 is the top edge
    notes = []
    for fx, fy, status in zip(failed["_dodged"], failed["_y"], failed[col.STATUS]):
        ax.plot([fx], [0.97], marker=FAILURE_MARKER, color=style.colour, markersize=8, markeredgecolor="black",
                markeredgewidth=0.6, linestyle="none", zorder=5, transform=top, clip_on=False)
        notes.append((fx, _failure_text(status, fy, unit), style.colour))
    if last_ok is not None and len(failed):
        ax.annotate("", xy=(failed["_dodged"].iloc[0], 0.97), xycoords=top, xytext=last_ok, textcoords="data",
                    arrowprops=dict(arrowstyle="-", linestyle=":", color=style.colour, linewidth=1, shrinkA=0,
                                    shrinkB=4), zorder=4)
    return notes


def _annotate(ax, notes: list[tuple], middle: float) -> None:
    """Each cross labelled with its status (and value when known), stacked downwards from the top edge
    where several curves fail at the same size."""
    top = ax.get_xaxis_transform()
    by_x: dict[float, list[tuple]] = {}
    for note in sorted(notes, key=lambda n: n[0]):
        by_x.setdefault(round(float(np.log2(note[0])) if note[0] > 0 else note[0], 1), []).append(note)
    for group in by_x.values():
        for row, (fx, text, colour) in enumerate(group):
            left = fx < middle  # text grows towards the inside of the panel, never past its frame
            ax.annotate(text, (fx, 0.97), xycoords=top, textcoords="offset points",
                        xytext=(6 if left else -6, -4 - 10 * row), ha="left" if left else "right", va="top",
                        fontsize=7, color=colour, zorder=6,
                        # a light backing keeps the text legible where it crosses another curve
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85))


def _quartiles(times: str) -> tuple[float, float]:
    """(q1, q3) of a ``times_s`` cell; NaN when it holds fewer than two samples."""
    samples = [float(t) for t in str(times).split(";") if t.strip()] if isinstance(times, str) else []
    if len(samples) < 2:
        return np.nan, np.nan
    q1, q3 = np.percentile(samples, [25, 75])
    return float(q1), float(q3)


def _values(rows: pd.DataFrame, name: str) -> pd.Series:
    """A metric's values in its unit (NaN where a column is empty or absent)."""
    m = metric(name)
    if any(c not in rows for c in m.columns):
        return pd.Series(np.nan, index=rows.index)
    values = pd.to_numeric(rows[m.column], errors="coerce")
    if m.minus:
        values = values - pd.to_numeric(rows[m.minus], errors="coerce")
    return values * m.scale


def _contended(rows: pd.DataFrame) -> pd.Series:
    """Measured rows whose trust flag is set (:mod:`topk_bench.results.trust`)."""
    flags = rows[col.TRUST].fillna("") if col.TRUST in rows.columns else pd.Series("", index=rows.index)
    return (rows[col.METHOD] == Method.MEASURED) & (flags != "")


def _draw_metric(ax, curves, spec: PlotSpec, metric_name: str, panel) -> None:
    """Draw one metric in one panel: a line per curve, IQR bars on measured times, crosses where curves stop."""
    m = metric(metric_name)
    all_x = []
    notes = []
    in_panel = [pd.to_numeric(r[spec.x], errors="coerce") for _, _, r in curves]
    xs = np.concatenate([x[_in_panel(x, panel)].to_numpy(float) for x in in_panel]) if curves else np.array([])
    span = (float(xs.min()), float(xs.max())) if len(xs) else (0.0, 1.0)
    middle = np.nan if not len(xs) else (
        np.sqrt(xs.min() * xs.max()) if spec.log_x and xs.min() > 0 else (xs.min() + xs.max()) / 2)
    for index, (legend, style, rows) in enumerate(curves):
        # Columns are added before filtering: assigning to an empty frame would add rows.
        x = pd.to_numeric(rows[spec.x], errors="coerce")
        rows = rows.assign(_x=x, _dodged=_dodge(x.to_numpy(float), index, len(curves), spec, span),
                           _y=_values(rows, metric_name))
        rows = rows[_in_panel(rows["_x"], panel)].sort_values("_x")
        ok = rows[(rows[col.STATUS] == Status.OK) & rows["_y"].notna()]
        if len(ok):
            line, = ax.plot(ok["_dodged"], ok["_y"], color=style.colour, marker=style.marker, markersize=6,
                            linewidth=1.6, label=legend, fillstyle="full" if style.filled else "none",
                            markeredgewidth=1.2)
            if style.dashes:
                line.set_dashes(style.dashes)
            contended = ok[_contended(ok)]
            if len(contended):  # hollow: a time taken on a busy machine or with spread samples
                ax.plot(contended["_dodged"], contended["_y"], marker=style.marker, markersize=6, linestyle="none",
                        markerfacecolor="white", markeredgecolor=style.colour, markeredgewidth=1.2, zorder=4)
            if m.column == col.TIME_MEDIAN_S and col.TIMES_S in ok:
                q1, q3 = zip(*(_quartiles(t) for t in ok[col.TIMES_S]))
                low = (ok["_y"] - np.asarray(q1) * m.scale).clip(lower=0)
                high = (np.asarray(q3) * m.scale - ok["_y"]).clip(lower=0)
                ax.errorbar(ok["_dodged"], ok["_y"], yerr=[low.fillna(0), high.fillna(0)], fmt="none",
                            ecolor=style.colour, elinewidth=1, capsize=2, alpha=0.8)
        failed = rows[rows[col.STATUS].isin(_STOPPED)]
        if len(failed):
            before = ok[ok["_x"] < failed["_x"].iloc[0]]
            last_ok = (before["_dodged"].iloc[-1], before["_y"].iloc[-1]) if len(before) else None
            notes += _draw_failures(ax, failed, last_ok, style, m.unit)
        all_x.extend(rows["_x"].tolist())
    _annotate(ax, notes, middle)
    if spec.log_x:
        ax.set_xscale("log", base=spec.log_x)
    if spec.log_y:
        ax.set_yscale("log")
    ax.margins(x=0.06, y=0.08)
    if notes:  # the crosses sit on the top edge: keep the curves below them
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.12 * (high - low)) if not spec.log_y else ax.set_ylim(low, high * 2)
    _set_x_ticks(ax, np.asarray(all_x, float), spec)
    ax.grid(True, which="major", alpha=0.3)


def _has_values(rows: pd.DataFrame, metric_name: str) -> bool:
    return bool(_values(rows, metric_name).notna().any())


def _not_shown(rows: pd.DataFrame) -> list[str]:
    """What the curves cannot show: implementations that did not run at all, and skipped cases."""
    labels = pd.Series(col.legends(rows), index=rows.index)
    notes = []
    unsupported = sorted(set(labels[rows[col.STATUS] == Status.UNSUPPORTED]))
    if unsupported:
        notes.append("unsupported: " + ", ".join(unsupported))
    never_ok = sorted(set(labels[rows[col.STATUS].isin(_STOPPED)]) - set(labels[rows[col.STATUS] == Status.OK]))
    if never_ok:
        notes.append("failed at every size: " + ", ".join(never_ok))
    skipped = int((rows[col.STATUS] == Status.SKIPPED).sum())
    if skipped:
        notes.append(f"{skipped} larger case(s) not run after a smaller one failed")
    return notes


def _title(spec: PlotSpec, rows: pd.DataFrame, device: str, method: str, width_in: float) -> str:
    """Suite title wrapped to the figure's width, then how the numbers were obtained."""
    if method == Method.PREDICTED:
        how = "predicted: allocated bytes at full scale, no time"
    else:
        names = sorted(set(rows[col.DEVICE_NAME].dropna().astype(str)) - {""})
        how = f"measured on {names[0] if len(names) == 1 else device}"
    title = spec.title
    if spec.split:  # one figure per value: say which
        title += " — " + ", ".join(f"{c} {_short(rows[c].iloc[0])}" for c in spec.split if c in rows and len(rows))
    if spec.protocol != DEFAULT_PROTOCOL:
        how += f"; {spec.protocol} protocol"
    return "\n".join([*textwrap.wrap(title, int(width_in * 11)), how])


def _legend_columns(labels: list[str], width_in: float) -> int:
    """As many columns as fit the figure's width at 8 pt (about 0.075 in per character plus the marker)."""
    widest = max((len(label) for label in labels), default=1) * 0.075 + 0.7
    return max(1, min(len(labels), int(width_in // widest)))


def _panels_with_data(rows: pd.DataFrame, spec: PlotSpec, metrics: list[str]):
    """The spec's panels that hold a measured value: a run at reduced scale (CPU) leaves the long-length panel empty."""
    ok = rows[rows[col.STATUS] == Status.OK]
    xs = pd.to_numeric(ok[spec.x], errors="coerce")
    has_value = pd.concat([_values(ok, m).notna() for m in metrics], axis=1)
    xs = xs[has_value.any(axis=1)]
    kept = tuple(p for p in spec.panels if _in_panel(xs, p).any())
    return kept or spec.panels


def draw_figure(rows: pd.DataFrame, spec: PlotSpec, device: str, method: str) -> Figure:
    """The default renderer: rows = metrics that have values, columns = spec.panels."""
    predicted = method == Method.PREDICTED
    # The protocol's own statistics: the paper's time is a mean, its measured CUDA memory reserved bytes;
    # otherwise "memory" is the allocated or reserved peak, as the spec asks.
    memory = memory_metric(spec, rows)
    metrics = [drawn_metric(m, spec.protocol, device, method) for m in spec.metrics]
    metrics = [memory if m == "memory" else m for m in metrics]
    metrics = [m for m in metrics if _has_values(rows, m)] or [metrics[0]]
    curves = _styled(_series(rows, spec), predicted)
    panels = _panels_with_data(rows, spec, metrics)
    ncols = len(panels)
    width = max(4.3 * ncols + 0.6, 6.4)  # a single panel still needs room for title and legend
    fig, axes = plt.subplots(len(metrics), ncols, figsize=(width, 2.9 * len(metrics) + 1.3),
                             squeeze=False, layout="constrained")
    for r, metric_name in enumerate(metrics):
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            _draw_metric(ax, curves, spec, metric_name, panel)
            if c == 0:
                ax.set_ylabel(metric(metric_name).label)
            if r == len(metrics) - 1:
                ax.set_xlabel(spec.x_label)
    handles, labels = _legend_entries(axes, rows)
    fig.legend(handles, labels, loc="outside lower center", ncol=_legend_columns(labels, width), fontsize=8,
               frameon=False)
    fig.suptitle(_title(spec, rows, device, method, width), fontsize=10)
    return fig


def _legend_entries(axes, rows: pd.DataFrame):
    """One entry per curve (first occurrence across panels), the failure cross when there is one, and what
    no curve shows."""
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if _contended(rows[rows[col.STATUS] == Status.OK]).any():
        seen["hollow: measured under contention (busy or noisy)"] = Line2D(
            [], [], marker="o", color="0.4", markerfacecolor="white", linestyle="none", markersize=6)
    if rows[col.STATUS].isin(_STOPPED).any():
        seen["stopped: above the frame (reason written)"] = Line2D(
            [], [], marker=FAILURE_MARKER, color="0.4", markeredgecolor="black", linestyle="none", markersize=8)
    for note in _not_shown(rows):  # entries of their own (no marker), not a heading over the legend
        seen[f"not shown: {note}"] = Line2D([], [], linestyle="none")
    return list(seen.values()), list(seen.keys())


# --- files -------------------------------------------------------------------------------------

def parse_formats(text: str) -> tuple[str, ...]:
    formats = tuple(f.strip().lower().lstrip(".") for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if not formats or bad:
        raise BadInput(f"expected a comma-separated list of {', '.join(FORMATS)}, got {text!r}", key="--format")
    return formats


def render(item: FigureInput, out_dir: Path, formats: tuple[str, ...]) -> list[Path]:
    fig = _resolve_renderer(item.spec)(item.rows, item.spec, item.device, item.method)
    try:
        paths = []
        for fmt in formats:
            path = out_dir / f"{item.stem}.{fmt}"
            buffer = io.BytesIO()
            fig.savefig(buffer, format=fmt, dpi=DPI)
            fileio.write_atomic(path, buffer.getvalue())  # a full disk leaves no half figure
            paths.append(path)
        return paths
    finally:
        plt.close(fig)


def plot_results(results: str | Path, out_dir: str | Path = "plots", formats: tuple[str, ...] = ("png",),
                 warn: Callable[[str], None] | None = None, memory: str | None = None) -> list[Path]:
    """Render every suite CSV of ``results`` into ``out_dir``; returns the files written.

    ``warn`` hears of every line of the CSVs left out, and of each figure that cannot draw the ``memory``
    asked for (``allocated`` or ``reserved``, instead of each suite's ``[plot] memory``).
    """
    if memory is not None and memory not in MEMORY_CHOICES:
        raise BadInput(f"expected one of {', '.join(MEMORY_CHOICES)}, got {memory!r}", key="--memory")
    inputs = figure_inputs(Path(results), warn)  # validates everything before writing anything
    if memory is not None:
        inputs = [dataclasses.replace(i, spec=dataclasses.replace(i.spec, memory=memory)) for i in inputs]
        for item in inputs:
            if warn and memory == "reserved" and memory_metric(item.spec, item.rows) != "reserved":
                warn(f"{item.stem}: not every measured point has reserved_bytes (only CUDA has them): "
                     "its memory row draws the allocated peak")
    for item in inputs:
        _resolve_renderer(item.spec)  # an unknown one is bad input before any file is written
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput("expected a directory, got a file", file=out, key="--out")
    out.mkdir(parents=True, exist_ok=True)
    written = [path for item in inputs for path in render(item, out, formats)]
    measured = [item.rows.loc[item.rows[col.METHOD] == Method.MEASURED, col.TRUST] for item in inputs]
    flagged = trust.warning(pd.concat(measured)) if measured else None
    if flagged and warn:
        warn(flagged + " (hollow markers)")
    return written
