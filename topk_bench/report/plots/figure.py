"""Figures like the paper's: metric rows (memory above time) by x-range panels (short lengths left, long right).

One figure per suite CSV and (device, method), saved as
``<suite>-<device>-<method>.<fmt>``. Failed points (OOM, over budget, timeout,
crash) are drawn as a cross where the curve stops, with the status written
next to it: a curve that simply ends would read as "not measured".

Plug-in renderers (e.g. fidelity against k) take over a suite's figure: either
``register_renderer("suite or workload", fn)`` in code, or
``"renderer": "package.module:function"`` in the suite's ``[plot]`` section
(which the runner copies to meta.json). A renderer is
``fn(rows: DataFrame, spec: PlotSpec, device: str, method: str) -> Figure``.
"""

from __future__ import annotations

import importlib
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

from topk_bench.errors import BadInput  # noqa: E402
from topk_bench.report.plots.inputs import FigureInput, figure_inputs  # noqa: E402
from topk_bench.report.plots.spec import PlotSpec  # noqa: E402
from topk_bench.report.plots.style import (  # noqa: E402
    FAILURE_MARKER, FAILURE_TEXT, format_power_of_two, format_size, impl_rank, series_style,
)
from topk_bench.results.columns import metric, parameter_columns  # noqa: E402
from topk_bench.status import Status  # noqa: E402

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


def _resolve_renderer(spec: PlotSpec) -> Renderer:
    if spec.renderer:
        module, _, name = spec.renderer.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise BadInput(f"cannot load renderer {spec.renderer!r} ({exc})", key="plot.renderer") from None
    return RENDERERS.get(spec.suite) or RENDERERS.get(spec.workload) or draw_figure


# --- series ------------------------------------------------------------------------------------

_STOPPED = tuple(FAILURE_TEXT)  # statuses drawn as a cross


def _series(rows: pd.DataFrame, spec: PlotSpec) -> list[tuple[str, str, pd.DataFrame]]:
    """(legend, impl, rows) per curve: by label, split further by any other parameter that varies inside it."""
    x = spec.x
    rows = rows.assign(label=rows["label"].where(rows["label"].notna() & (rows["label"] != ""), rows["impl"]))
    parameters = spec.parameters if spec.parameters is not None else parameter_columns(rows.columns)
    others = [c for c in parameters if c != x and c in rows.columns]
    out = []
    for label, group in rows.groupby("label", sort=False):
        varying = [c for c in others if group[c].nunique(dropna=True) > 1]
        if not varying:
            out.append((str(label), str(group["impl"].iloc[0]), group))
            continue
        for values, sub in group.groupby(varying, sort=True, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            suffix = ", ".join(f"{c}={_short(v)}" for c, v in zip(varying, values))
            out.append((f"{label} ({suffix})", str(sub["impl"].iloc[0]), sub))
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


def _draw_failures(ax, ok_x, ok_y, failed: pd.DataFrame, style, unit: str, panel) -> list[tuple]:
    """A cross at each failed size, level with the last value measured before it (the curve "stops" there).

    Returns the annotations (x, y, text, colour) for the caller to merge: several
    curves often stop at the same size. A known value (e.g. a predicted peak over
    the budget) goes into the text rather than the plot, so it does not squash the scale.
    """
    notes = []
    for fx, fy, status in zip(failed["_x"], failed["_y"], failed["status"]):
        before = [(x, y) for x, y in zip(ok_x, ok_y) if x < fx]
        level = before[-1][1] if before else (ok_y[0] if len(ok_y) else fy)
        if not np.isfinite(level):
            continue  # nothing to stand on: listed in the legend title instead
        ax.plot([fx], [level], marker=FAILURE_MARKER, color=style.colour, markersize=9,
                markeredgecolor="black", markeredgewidth=0.6, linestyle="none", zorder=5)
        if before and _in_panel(pd.Series([before[-1][0]]), panel).all():
            ax.plot([before[-1][0], fx], [level, level], color=style.colour, linestyle=":", linewidth=1)
        if not notes:  # the first failure of a curve is the one that matters (larger ones follow from it)
            text = FAILURE_TEXT.get(status, status)
            if np.isfinite(fy):
                text += f" ({fy:.3g} {unit})".replace(" )", ")")
            notes.append((fx, level, text, style.colour))
    return notes


def _annotate(ax, notes: list[tuple], middle: float) -> None:
    """One annotation per failed size, above its highest cross; coloured as the curve when it is the only one."""
    for fx in sorted({n[0] for n in notes}):
        here = [n for n in notes if n[0] == fx]
        texts = list(dict.fromkeys(n[2] for n in here))
        colour = here[0][3] if len({n[3] for n in here}) == 1 else "0.25"
        left = fx < middle  # text grows towards the inside of the panel, never past its frame
        ax.annotate(" / ".join(texts), (fx, max(n[1] for n in here)), textcoords="offset points",
                    xytext=(4 if left else -4, 6), ha="left" if left else "right", va="bottom",
                    fontsize=7, color=colour, zorder=6,
                    # a light backing keeps the text legible where it crosses another curve
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85))


def _draw_metric(ax, curves, spec: PlotSpec, metric_name: str, panel) -> None:
    """Draw one metric in one panel."""
    m = metric(metric_name)
    all_x = []
    notes = []
    in_panel = [pd.to_numeric(r[spec.x], errors="coerce") for _, _, r in curves]
    xs = np.concatenate([x[_in_panel(x, panel)].to_numpy(float) for x in in_panel]) if curves else np.array([])
    middle = np.nan if not len(xs) else (
        np.sqrt(xs.min() * xs.max()) if spec.log_x and xs.min() > 0 else (xs.min() + xs.max()) / 2)
    for legend, style, rows in curves:
        # Columns are added before filtering: assigning to an empty frame would add rows.
        rows = rows.assign(_x=pd.to_numeric(rows[spec.x], errors="coerce"),
                           _y=pd.to_numeric(rows[m.column], errors="coerce") * m.scale)
        series_ok = rows[(rows["status"] == Status.OK) & rows["_y"].notna() & rows["_x"].notna()].sort_values("_x")
        rows = rows[_in_panel(rows["_x"], panel)]
        ok = series_ok[_in_panel(series_ok["_x"], panel)]
        if len(ok):
            line, = ax.plot(ok["_x"], ok["_y"], color=style.colour, marker=style.marker, markersize=6,
                            linewidth=1.6, label=legend, fillstyle="full" if style.filled else "none",
                            markeredgewidth=1.2)
            if style.dashes:
                line.set_dashes(style.dashes)
        failed = rows[rows["status"].isin(_STOPPED)].sort_values("_x")
        if len(failed):
            notes += _draw_failures(ax, series_ok["_x"].to_numpy(float), series_ok["_y"].to_numpy(float),
                                    failed, style, m.unit, panel)
        all_x.extend(rows["_x"].tolist())
    _annotate(ax, notes, middle)
    if spec.log_x:
        ax.set_xscale("log", base=spec.log_x)
    if spec.log_y:
        ax.set_yscale("log")
    ax.margins(x=0.06, y=0.14)  # room for the failure annotations inside the frame
    _set_x_ticks(ax, np.asarray(all_x, float), spec)
    ax.grid(True, which="major", alpha=0.3)


def _has_values(rows: pd.DataFrame, metric_name: str) -> bool:
    column = metric(metric_name).column
    return column in rows and pd.to_numeric(rows[column], errors="coerce").notna().any()


def _footnote(rows: pd.DataFrame) -> str:
    """What the curves cannot show: implementations that did not run at all, and skipped cases."""
    labels = rows["label"].where(rows["label"].notna() & (rows["label"] != ""), rows["impl"]).astype(str)
    notes = []
    unsupported = sorted(set(labels[rows["status"] == Status.UNSUPPORTED]))
    if unsupported:
        notes.append("unsupported: " + ", ".join(unsupported))
    never_ok = sorted(set(labels[rows["status"].isin(_STOPPED)]) - set(labels[rows["status"] == Status.OK]))
    if never_ok:
        notes.append("failed at every size: " + ", ".join(never_ok))
    skipped = int((rows["status"] == Status.SKIPPED).sum())
    if skipped:
        notes.append(f"{skipped} larger case(s) not run after a failure")
    return "; ".join(notes)


def _title(spec: PlotSpec, rows: pd.DataFrame, device: str, method: str, width_in: float) -> str:
    """Suite title wrapped to the figure's width, then how the numbers were obtained."""
    if method == "predicted":
        how = "predicted: allocated bytes at full scale, no time"
    else:
        names = sorted(set(rows["device_name"].dropna().astype(str)) - {""})
        how = f"measured on {names[0] if len(names) == 1 else device}"
    return "\n".join([*textwrap.wrap(spec.title, int(width_in * 11)), how])


def _legend_columns(labels: list[str], width_in: float) -> int:
    """As many columns as fit the figure's width at 8 pt (about 0.075 in per character plus the marker)."""
    widest = max((len(label) for label in labels), default=1) * 0.075 + 0.7
    return max(1, min(len(labels), int(width_in // widest)))


def _panels_with_data(rows: pd.DataFrame, spec: PlotSpec, metrics: list[str]):
    """The spec's panels that hold a measured value: a run at reduced scale (CPU) leaves the long-length panel empty."""
    ok = rows[rows["status"] == Status.OK]
    xs = pd.to_numeric(ok[spec.x], errors="coerce")
    has_value = pd.concat([pd.to_numeric(ok[metric(m).column], errors="coerce").notna() for m in metrics], axis=1)
    xs = xs[has_value.any(axis=1)]
    kept = tuple(p for p in spec.panels if _in_panel(xs, p).any())
    return kept or spec.panels


def draw_figure(rows: pd.DataFrame, spec: PlotSpec, device: str, method: str) -> Figure:
    """The default renderer: rows = metrics that have values, columns = spec.panels."""
    predicted = method == "predicted"
    metrics = [m for m in spec.metrics if _has_values(rows, m)] or [spec.metrics[0]]
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
    # The legend's title carries what no curve shows, so it never overlaps a plot.
    fig.legend(handles, labels, loc="outside lower center", ncol=_legend_columns(labels, width), fontsize=8,
               frameon=False, title=_footnote(rows) or None, title_fontsize=7)
    fig.suptitle(_title(spec, rows, device, method, width), fontsize=10)
    return fig


def _legend_entries(axes, rows: pd.DataFrame):
    """One entry per curve (first occurrence across panels), plus the failure cross when there is one."""
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if rows["status"].isin(_STOPPED).any():
        seen["stopped (reason written)"] = Line2D(
            [], [], marker=FAILURE_MARKER, color="0.4", markeredgecolor="black", linestyle="none", markersize=8)
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
            fig.savefig(path, dpi=DPI)
            paths.append(path)
        return paths
    finally:
        plt.close(fig)


def plot_results(results: str | Path, out_dir: str | Path = "plots", formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """Render every suite CSV of ``results`` into ``out_dir``; returns the files written."""
    inputs = figure_inputs(Path(results))  # validates everything before writing anything
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [path for item in inputs for path in render(item, out, formats)]
