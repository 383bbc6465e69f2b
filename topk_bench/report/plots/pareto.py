"""Quality against time: the plane on which selection methods are compared (``[plot] pareto = true``).

One figure per measured (suite, device, method), ``<suite>-pareto-<device>-<method>.<fmt>``,
next to the suite's own figure. x: time per token (ms; a suite without it: time per
iteration), log scale; one panel per quality, side by side: mass recall (higher is better)
and relative error of the output against exact attention (lower is better, log scale).
The quality is on the pretrained MiniLM's activations when the rows have it, else on
synthetic peaked inputs (sinks, locality, heavy hitters; with top-k recall as a third panel),
else on random inputs (whose attention is flat: there every method keeps about its share of the
keys, so random quality says little about a method).

- one curve per method through its budgets (the suite's x, e.g. the token budget), in
  budget order, each point labelled with its budget;
- a method whose quality does not move with the budget (dense attention, the reference)
  is one point, a larger marker, at the median of its times;
- grey steps: the Pareto front, the points that no other point beats in both time and
  quality;
- a hollow marker: a time measured under contention (as on every time panel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from topk_bench.report.plots import marks, scales
from topk_bench.report.plots.palette import SeriesStyle
from topk_bench.report.plots.series import series, short, styled
from topk_bench.report.plots.spec import PlotSpec
from topk_bench.results import columns as col
from topk_bench.results.columns import metric
from topk_bench.status import Status
from topk_bench.types import Method
from topk_bench.untrusted import figure

# The qualities drawn, per input kind, in the order of preference of the kinds.
QUALITIES = {
    "minilm": ("minilm_mass_recall", "minilm_attn_rel_err"),
    # Peaked inputs: also the share of exact attention's top-k keys a method finds (k = the keys it attends).
    "peaked": ("peaked_mass_recall", "peaked_topk_recall", "peaked_attn_rel_err"),
    "random": ("mass_recall", "attn_rel_err"),
}
LOWER_IS_BETTER = frozenset({"minilm_attn_rel_err", "peaked_attn_rel_err", "attn_rel_err"})
INPUTS = {
    "minilm": "the pretrained MiniLM's activations",
    "peaked": "synthetic peaked inputs",
    "random": "random inputs",
}
REFERENCE_SIZE = 11
FRONT_STYLE: dict[str, Any] = dict(color="0.55", linewidth=5, alpha=0.35, solid_capstyle="round", zorder=0)
REFERENCE_LEGEND = (
    "large marker: a method whose quality does not move with the budget (the reference), at its median time"
)
FRONT_LEGEND = "grey steps: Pareto front (no other point both faster and better)"


@dataclass
class Curve:
    """One method's points on one panel: x (time), y (quality), the budget, hollow (time under contention)."""

    legend: str
    style: SeriesStyle
    points: pd.DataFrame  # columns x, y, budget, hollow; one row for a reference
    reference: bool


def axes_metrics(rows: pd.DataFrame) -> tuple[str, tuple[str, ...]]:
    """(x metric, y metrics): time per token where the rows have it, and the qualities of the first input kind
    that has values."""
    x = "time_per_token" if marks.values(rows, "time_per_token").notna().any() else "time"
    for names in QUALITIES.values():
        present = tuple(n for n in names if marks.values(rows, n).notna().any())
        if present:
            return x, present
    return x, ()


def wanted(spec: PlotSpec, rows: pd.DataFrame, method: str) -> bool:
    """Whether the figure is drawn: asked for, measured (a prediction has no time), and some row has a time and
    a quality."""
    if not spec.pareto or method != Method.MEASURED:
        return False
    x, ys = axes_metrics(rows)
    ok = rows[rows[col.STATUS] == Status.OK]
    return bool(ys) and any((marks.values(ok, x).notna() & marks.values(ok, y).notna()).any() for y in ys)


def _constant(values: pd.Series) -> bool:
    values = values.dropna().to_numpy(float)
    return len(values) > 1 and bool(np.allclose(values, values[0], rtol=1e-9, atol=0))


def curves(rows: pd.DataFrame, spec: PlotSpec, x_metric: str, y_metrics: tuple[str, ...]) -> dict[str, list[Curve]]:
    """Per y metric, the curves as drawn: the CSV's values in the metrics' units, ok rows with both values."""
    out: dict[str, list[Curve]] = {y: [] for y in y_metrics}
    ok = rows[rows[col.STATUS] == Status.OK]
    for legend, style, group in styled(series(ok, spec)):
        points = pd.DataFrame(
            {
                "x": marks.values(group, x_metric),
                "budget": pd.to_numeric(group[spec.x], "coerce"),
                "hollow": marks.contended(group),
            },
            index=group.index,
        )
        reference = all(_constant(marks.values(group, y)) for y in y_metrics)
        for y in y_metrics:
            drawn = points.assign(y=marks.values(group, y)).dropna(subset=["x", "y"]).sort_values("budget")
            if not len(drawn):
                continue
            if reference:  # one point: the median time, its one quality; hollow if any of its times is
                drawn = pd.DataFrame(
                    {
                        "x": [drawn["x"].median()],
                        "y": [drawn["y"].iloc[0]],
                        "budget": [np.nan],
                        "hollow": [bool(drawn["hollow"].any())],
                    }
                )
            out[y].append(Curve(legend, style, drawn.reset_index(drop=True), reference))
    return out


def front(points: pd.DataFrame, lower_is_better: bool) -> pd.DataFrame:
    """The points no other point beats in both x (lower is better) and y, in x order."""
    ordered = points.sort_values(["x", "y"], ascending=[True, lower_is_better])
    best, keep = None, []
    for index, y in ordered["y"].items():
        if best is None or (y < best if lower_is_better else y > best):
            best = y
            keep.append(index)
    return ordered.loc[keep]


def _draw_panel(ax, panel: list[Curve], y_metric: str, x_label: str) -> set[str]:
    used: set[str] = set()
    for curve in panel:
        p = curve.points
        if curve.reference:
            (line,) = ax.plot(
                p["x"],
                p["y"],
                linestyle="none",
                marker=curve.style.marker,
                color=curve.style.colour,
                markersize=REFERENCE_SIZE,
                markeredgecolor="black",
                markeredgewidth=0.8,
                label=curve.legend,
                zorder=3,
            )
            if p["hollow"].any():
                line.set_markerfacecolor("white")
                line.set_markeredgecolor(curve.style.colour)
                used.add(marks.HOLLOW_LEGEND)
            used.add(REFERENCE_LEGEND)
        else:
            line = marks.curve(ax, p["x"], p["y"], curve.style, curve.legend, p["hollow"])
            if p["hollow"].any():
                used.add(marks.HOLLOW_LEGEND)
        line.set_gid(f"pareto:{curve.legend}")  # tests read a curve's points back by it
    if panel:
        best = front(pd.concat([c.points for c in panel], ignore_index=True), y_metric in LOWER_IS_BETTER)
        ax.step(best["x"], best["y"], where="post", **FRONT_STYLE)
        used.add(FRONT_LEGEND)
    ax.set_xscale("log")
    if y_metric in LOWER_IS_BETTER:
        ax.set_yscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel(metric(y_metric).label + (" (lower is better)" if y_metric in LOWER_IS_BETTER else ""))
    ax.grid(True, which="major", alpha=0.3)
    ax.margins(x=0.08, y=0.08)
    ax.autoscale_view()
    _plain_ticks(ax)
    _label_budgets(ax, [c for c in panel if not c.reference])
    return used


def _plain_ticks(ax) -> None:
    """Times as plain numbers (20, 50, 100 ms), not powers of ten; 2 and 5 between them where the axis spans
    at most two decades (more would crowd)."""
    low, high = ax.get_xlim()
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    few = high / low <= 100
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if few and f"{v:.0e}"[0] in "25" else ""))


# Two budget labels closer than this (in axes fractions: about a label's width, and its height) would overlap.
_LABEL_APART = (0.05, 0.035)


def _label_budgets(ax, panel: list[Curve]) -> None:
    """Each point labelled with its budget, small, in its curve's colour: each curve's ends first, then the
    points between, leaving out a label that would overlap one already placed (the curve's order tells it)."""
    to_axes = ax.transData + ax.transAxes.inverted()  # limits and scales are final: positions are fractions
    ends = [(c, i) for c in panel for i in sorted({0, len(c.points) - 1})]
    middles = [(c, i) for c in panel for i in range(1, len(c.points) - 1)]
    placed: list[tuple[float, float]] = []
    for curve, i in ends + middles:
        x, y, budget = curve.points.loc[i, ["x", "y", "budget"]]
        fx, fy = to_axes.transform((x, y))
        if any(abs(fx - px) < _LABEL_APART[0] and abs(fy - py) < _LABEL_APART[1] for px, py in placed):
            continue
        placed.append((fx, fy))
        ax.annotate(
            short(budget), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6, color=curve.style.colour
        )


def draw(rows: pd.DataFrame, spec: PlotSpec, device: str, method: str) -> Figure:
    """The quality-against-time figure of ``rows`` (:func:`wanted` says whether it has anything to show)."""
    x_metric, y_metrics = axes_metrics(rows)
    panels = curves(rows, spec, x_metric, y_metrics)
    width = 4.6 * len(y_metrics) + 0.6
    fig, axes = plt.subplots(1, len(y_metrics), figsize=(width, 5.0), squeeze=False, layout="constrained")
    used: set[str] = set()
    for ax, y in zip(axes[0], y_metrics):
        used |= _draw_panel(ax, panels[y], y, metric(x_metric).label)
    legend_in = marks.fitted_legend(fig, *_legend(axes, rows, used, spec), width)
    names = sorted(set(rows[col.DEVICE_NAME].dropna().astype(str)) - {""})
    kind = next((kind for kind, names in QUALITIES.items() if y_metrics[0] in names), "random")
    inputs = INPUTS[kind]
    # Its own title: the suite's says what the suite's figure shows (quality against the budget), not this one.
    fig.suptitle(
        figure(
            f"{spec.suite}: quality ({inputs}) against {metric(x_metric).label.split(' (')[0]}, a curve per method "
            f"through its {spec.x}"
        )
        + f"\nmeasured on {figure(names[0] if len(names) == 1 else device)}",
        fontsize=10,
    )
    fig.set_size_inches(width, 4.4 + legend_in)
    return fig


def _legend(axes, rows: pd.DataFrame, used: set[str], spec: PlotSpec) -> tuple[list[object], list[str]]:
    """Each method once, then every other encoding the panels used, then what no panel shows."""
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    seen[f"small numbers: {scales.filled(spec.x_label, rows)}"] = marks.text_handle()
    if REFERENCE_LEGEND in used:
        seen[REFERENCE_LEGEND] = Line2D(
            [], [], marker="o", color="0.4", markeredgecolor="black", linestyle="none", markersize=REFERENCE_SIZE * 0.8
        )
    if FRONT_LEGEND in used:
        seen[FRONT_LEGEND] = Line2D([], [], **FRONT_STYLE)
    if marks.HOLLOW_LEGEND in used:
        seen[marks.HOLLOW_LEGEND] = marks.hollow_handle()
    stopped = rows[rows[col.STATUS].isin(marks.STOPPED)]
    if len(stopped):
        cases = ", ".join(
            f"{legend} at {short(x)} ({status})"
            for legend, x, status in zip(col.legends(stopped), stopped[spec.x], stopped[col.STATUS])
        )
        seen[f"not shown: {cases}"] = marks.text_handle()
    for note in marks.not_shown(rows):
        if not note.startswith("stopped at every size"):
            seen[f"not shown: {note}"] = marks.text_handle()
    return list(seen.values()), list(seen.keys())
