"""Per-stage cost: where each method's time and memory go, stage by stage (docs/CONTRACTS.md, "Per-stage cost").

Drawn for every (suite, device, method) whose rows carry per-stage columns (implementations that mark their
stages: ``stage_times_s``, ``stage_peak_bytes``), as ``<suite>-stages-<device>-<method>.<fmt>`` next to the suite's
own figure. One bar per method at each size of the suite's x (grouped by size, methods side by side):

- top (measured rows): the iteration's time, stacked by stage: forward stages solid, backward ones hatched, in
  a fixed colour per stage name, and the rest of the median iteration (projections, loss, framework: the median
  less the stages' sum) in light grey on top; the stages' seconds come from one extra iteration, so the bar's
  height is the median only where the rest is not negative (a stage sum above the median is drawn as it is,
  without a grey part);
- bottom: each stage's peak above the baseline (inputs and parameters), side by side within the method's slot
  (peaks are not additive), the iteration's own peak as a black tick across the slot: the stage that reaches it
  is where the memory goes.

A method without stage columns (dense attention) is left out of this figure; its time and memory are in the
suite's own figure.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from topk_bench.report.plots import scales
from topk_bench.report.plots.series import short
from topk_bench.report.plots.spec import PlotSpec
from topk_bench.results import columns as col
from topk_bench.results.stage_cells import read
from topk_bench.status import Status
from topk_bench.untrusted import figure

# Fixed colours per stage name, so that one stage reads alike in every figure (others cycle after them).
STAGE_COLOURS = {
    "indexer": "#1f77b4",
    "compression": "#17becf",
    "selection": "#ff7f0e",
    "attention": "#2ca02c",
    "indexer_loss": "#9467bd",
}
REST_COLOUR = "#d9d9d9"
PHASES = ("forward", "backward")


def wanted(rows: pd.DataFrame) -> bool:
    """Whether some ok row carries per-stage columns."""
    ok = rows[rows[col.STATUS] == Status.OK] if col.STATUS in rows else rows
    return any(c in ok and ok[c].astype(str).str.strip().replace("nan", "").ne("").any() for c in col.STAGE_COLUMNS)


def _ordered(keys) -> list[str]:
    """``forward.*`` then ``backward.*``, stages in their conventional order within each."""
    known = list(STAGE_COLOURS)

    def rank(key: str):
        phase, _, name = key.partition(".")
        return (PHASES.index(phase) if phase in PHASES else 2, known.index(name) if name in known else 99, name)

    return sorted(set(keys), key=rank)


def _colour(name: str, extra: dict[str, str]) -> str:
    if name in STAGE_COLOURS:
        return STAGE_COLOURS[name]
    return extra.setdefault(name, f"C{5 + len(extra)}")


def _slots(rows: pd.DataFrame, x: str) -> tuple[list, list[str], dict]:
    """(sizes, methods, (size, method) -> row): the last row of each pair wins (a re-measured case)."""
    legends = pd.Series(col.legends(rows), index=rows.index)
    sizes = sorted(rows[x].dropna().unique().tolist()) if x in rows else [None]
    methods = list(dict.fromkeys(legends))
    cells = {}
    for index, row in rows.iterrows():
        cells[(row[x] if x in rows else None, legends[index])] = row
    return sizes, methods, cells


def draw(rows: pd.DataFrame, spec: PlotSpec, device: str, method: str) -> Figure:
    ok = rows[rows[col.STATUS] == Status.OK]
    ok = ok[[bool(read(t) or read(p)) for t, p in zip(ok.get(col.STAGE_TIMES_S, ""), ok.get(col.STAGE_PEAK_BYTES, ""))]]
    x = spec.x if spec.x in ok else next((c for c in ("seq_len", "kv_len") if c in ok), "")
    sizes, methods, cells = _slots(ok, x)
    timed = col.STAGE_TIMES_S in ok and any(read(v) for v in ok[col.STAGE_TIMES_S])
    fig, axes = plt.subplots(
        2 if timed else 1,
        1,
        figsize=(max(6.0, 1.1 * len(sizes) * max(len(methods), 1) + 2), 6.4 if timed else 3.6),
        squeeze=False,
        layout="constrained",
    )
    width = 0.8 / max(len(methods), 1)
    extra: dict[str, str] = {}
    seen: set[str] = set()
    ticks, labels = [], []
    for i, size in enumerate(sizes):
        for j, name in enumerate(methods):
            row = cells.get((size, name))
            if row is None:
                continue
            centre = i + (j - (len(methods) - 1) / 2) * width
            ticks.append(centre)
            labels.append(figure(str(name)))
            if timed:
                seen |= _time_bar(axes[0][0], row, centre, width, extra)
            seen |= _peak_bars(axes[-1][0], row, centre, width, extra)
    for ax in axes[:, 0]:
        ax.set_xticks(ticks, labels, rotation=30, ha="right", fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        for i, size in enumerate(sizes):
            ax.annotate(
                figure(f"{x} = {short(size)}" if x else ""),
                (i, 1.0),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    if timed:
        axes[0][0].set_ylabel("time per iteration (s)")
    axes[-1][0].set_ylabel("peak above inputs (MiB)")
    handles = [
        Patch(
            facecolor=_colour(key.partition(".")[2], extra),
            hatch="//" if key.startswith("backward") else None,
            label=key.replace(".", " "),
        )
        for key in _ordered(seen)
    ]
    if timed:
        handles.append(Patch(facecolor=REST_COLOUR, label="rest of the iteration"))
    handles.append(plt.Line2D([], [], color="black", linewidth=2, label="iteration peak"))
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    fig.suptitle(figure(f"{scales.filled(spec.title, rows)}: per stage — {device}, {method}"), fontsize=10)
    return fig


def _time_bar(ax, row: pd.Series, centre: float, width: float, extra: dict[str, str]) -> set[str]:
    times = read(row.get(col.STAGE_TIMES_S, ""))
    bottom = 0.0
    for key in _ordered(times):
        name = key.partition(".")[2]
        hatch = "//" if key.startswith("backward") else None
        ax.bar(
            centre,
            times[key],
            width * 0.9,
            bottom=bottom,
            color=_colour(name, extra),
            hatch=hatch,
            edgecolor="white",
            linewidth=0.5,
        )
        bottom += times[key]
    median = row.get(col.TIME_MEDIAN_S)
    if median is not None and np.isfinite(float(median)) and float(median) > bottom:
        ax.bar(
            centre,
            float(median) - bottom,
            width * 0.9,
            bottom=bottom,
            color=REST_COLOUR,
            edgecolor="white",
            linewidth=0.5,
        )
    return set(times)


def _peak_bars(ax, row: pd.Series, centre: float, width: float, extra: dict[str, str]) -> set[str]:
    peaks = read(row.get(col.STAGE_PEAK_BYTES, ""))
    baseline = float(row.get(col.BASELINE_BYTES) or 0.0)
    keys = _ordered(peaks)
    slot = width * 0.9 / max(len(keys), 1)
    left = centre - width * 0.45
    for n, key in enumerate(keys):
        name = key.partition(".")[2]
        hatch = "//" if key.startswith("backward") else None
        ax.bar(
            left + (n + 0.5) * slot,
            (peaks[key] - baseline) / 2**20,
            slot,
            color=_colour(name, extra),
            hatch=hatch,
            edgecolor="white",
            linewidth=0.5,
        )
    peak = row.get(col.PEAK_BYTES)
    if peak is not None and np.isfinite(float(peak)):
        y = (float(peak) - baseline) / 2**20
        ax.plot([centre - width * 0.45, centre + width * 0.45], [y, y], color="black", linewidth=2)
    return set(peaks)
