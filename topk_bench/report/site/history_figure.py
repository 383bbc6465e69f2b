"""One case's history drawn: its time (above) and its peak (below) at each commit, oldest left; a dashed line
before each step with its factor written (``×1.31``), and the time gate's verdicts where it gave one (a red
triangle up: regressed; a green one down: improved; an orange diamond: undecided).

The figure is an SVG the page shows as an image, and each point is an area of the image's map (plain HTML, no
script) that links to its commit: the points' places are read off matplotlib's transform at 72 dots per inch,
the SVG's own unit (a point), and written in CSS pixels (4/3 of a point).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from topk_bench import untrusted
from topk_bench.report.plots import scales
from topk_bench.report.site.history import Commit, Series
from topk_bench.report.steps import Step
from topk_bench.results.columns import Metric, metric
from topk_bench.units import short_bytes, short_seconds, wrap

SVG_DPI = 72  # an SVG's unit is the point: 72 per inch
CSS_PER_POINT = 96 / 72
MARKS: dict[str, dict[str, Any]] = {
    "regressed": dict(marker="^", color="#c62828", label="gate: regressed"),
    "improved": dict(marker="v", color="#2e7d32", label="gate: improved"),
    "undecided": dict(marker="D", color="#ef8f00", label="gate: undecided"),
}
# At most this many commit names under the axis (the others' ticks stay, unnamed).
NAMED_TICKS = 24


@dataclass(frozen=True)
class Area:
    """A circle of the image map: its centre and radius in CSS pixels, the commit it links to, its tooltip."""

    x: int
    y: int
    r: int
    commit: int
    title: str


@dataclass
class Drawn:
    svg: bytes
    width: int  # CSS pixels
    height: int
    areas: list[Area]


def _panel(
    ax, values: list[float | None], which: str, series: Series, found: list[Step], relative_to: str | None = None
) -> np.ndarray:
    """One metric's points and line; returns the points as (index, value in the panel's unit), NaN where none.
    ``relative_to``: the times are ratios to that implementation's."""
    raw = np.array([np.nan if v is None else v for v in values], dtype=float)
    m, _ = scales.fitted(metric(which), raw * metric(which).scale)
    if relative_to is not None and which == "time":
        m = Metric("time_ratio", "", 1.0, f"time over {untrusted.figure(relative_to)}'s")
    y = raw * m.scale  # the fitted metric's scale takes the values to its unit
    x = np.arange(len(values), dtype=float)
    known = np.isfinite(y)
    ax.plot(x[known], y[known], "-o", color="#1f5fa8", markersize=4, linewidth=1.2, zorder=3)
    for step in found:
        ax.axvline(step.index - 0.5, color="#c62828" if step.up else "#2e7d32", linestyle="--", linewidth=1, zorder=2)
        ax.annotate(
            f"×{step.ratio:.2f}",
            (step.index - 0.5, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            va="top",
            fontsize=8,
            color="#c62828" if step.up else "#2e7d32",
        )
    if which == "time":
        for verdict_name, style in MARKS.items():
            at = [i for i, v in enumerate(series.verdicts) if v is not None and v.verdict == verdict_name and known[i]]
            if at:
                ax.plot(x[at], y[at], linestyle="none", markersize=9, zorder=4, **style)
    if not known.any() and relative_to is not None and which == "time":
        ax.text(
            0.5,
            0.5,
            "the reference: the other times are over its own",
            ha="center",
            va="center",
            fontsize=8,
            transform=ax.transAxes,
            color="0.4",
        )
    ax.set_ylabel(m.label, fontsize=8)
    if known.any():
        low, high = float(np.nanmin(y)), float(np.nanmax(y))
        ax.set_ylim(0 if low >= 0 else low * 1.1, high * 1.25 if high > 0 else 1)
    ax.grid(True, alpha=0.3)
    return np.column_stack([x, y])


def _ticks(ax, commits: list[Commit]) -> None:
    every = max(1, -(-len(commits) // NAMED_TICKS))
    ax.set_xticks(range(len(commits)))
    ax.set_xticklabels(
        [untrusted.figure(c.label) if i % every == 0 else "" for i, c in enumerate(commits)],
        rotation=45,
        ha="right",
        fontsize=7,
    )
    ax.set_xlim(-0.5, len(commits) - 0.5)


def draw(series: Series, commits: list[Commit], relative_to: str | None = None) -> Drawn:
    """The figure of one case's history, and its points' areas."""
    width = min(max(4.8, 0.32 * len(commits) + 2.0), 14.0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 4.6), sharex=True, layout="constrained", dpi=SVG_DPI)
    try:
        time_points = _panel(top, series.times, "time", series, series.time_steps, relative_to)
        peak_points = _panel(bottom, series.peaks, "memory", series, series.peak_steps)
        _ticks(bottom, commits)
        title = wrap(untrusted.figure(untrusted.abridged(series.name, 240)), int(width * 12))
        fig.suptitle("\n".join(title), fontsize=9)
        if any(v is not None for v in series.verdicts):
            handles = [
                plt.Line2D([], [], linestyle="none", markersize=7, **style)
                for name, style in MARKS.items()
                if any(v is not None and v.verdict == name for v in series.verdicts)
            ]
            if handles:
                top.legend(handles=handles, fontsize=7, loc="upper left")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg")
        height_pt = fig.get_figheight() * SVG_DPI
        areas = _areas(top, time_points, commits, height_pt, "time" if relative_to is None else "ratio", series.times)
        areas += _areas(bottom, peak_points, commits, height_pt, "peak", series.peaks)
        return Drawn(buffer.getvalue(), round(width * SVG_DPI * CSS_PER_POINT), round(height_pt * CSS_PER_POINT), areas)
    finally:
        plt.close(fig)


def _areas(ax, points: np.ndarray, commits: list[Commit], height_pt: float, what: str, values) -> list[Area]:
    """The image map's circle of each point (after savefig: the layout is the saved one)."""
    out = []
    shown = ax.transData.transform(np.nan_to_num(points))
    for i, ((px, py), value) in enumerate(zip(shown, values)):
        if value is None:
            continue
        x, y = px * CSS_PER_POINT, (height_pt - py) * CSS_PER_POINT
        out.append(Area(round(x), round(y), 7, i, f"{commits[i].label}: {what} {_value(what, value)}"))
    return out


def _value(what: str, value: float) -> str:
    if what == "ratio":
        return f"×{value:.3f}"
    return short_seconds(value) if what == "time" else short_bytes(value)
