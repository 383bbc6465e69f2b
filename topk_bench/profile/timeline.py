"""``timeline.png``: live bytes over the iteration's ops, stacked by source line, as memory_viz's active memory.

The x axis counts the aten ops the iteration dispatched (forward, then backward, shaded); each band is
one source line's live storages (the largest lines at the peak; the rest as one band); the inputs and
parameters lie at the bottom. The peak is marked. Sized to be read on a printed page (17 cm wide).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topk_bench import fileio
from topk_bench.profile.attribution import Attribution, Phase
from topk_bench.profile.sources import code_line, label
from topk_bench.units import GIB, KIB, MIB

BANDS = 10  # source lines drawn on their own; the others are one band
POINTS = 500  # at most this many points across (each the highest moment of its span of ops)
BASELINE_BAND = "inputs and parameters"
OTHER_BAND = "other lines"


@dataclass
class Series:
    ops: np.ndarray            # x: op indices, each op once
    bands: list[str]           # bottom first
    live: np.ndarray           # [bands, points]: live bytes of each band at the highest moment of each span of ops
    backward_from: int | None  # the first op of the backward
    peak_op: int               # the op at which the peak was reached
    peak_bytes: int
    at_peak: np.ndarray        # [bands]: live bytes of each band at the moment of the peak


def _band_of(tracker: Attribution) -> dict[int, str]:
    return {serial: BASELINE_BAND if s.phase is Phase.BASELINE else label(s.where)
            for serial, s in tracker.storages.items()}


def series(tracker: Attribution, bands: int = BANDS, least: float = 0.01) -> Series:
    """The stacked live bytes by source line, one point per span of ops (its highest moment: an op that allocates and frees
    shows what it held). Lines drawn on their own: the ``bands`` largest at their own highest, each at least
    ``least`` of the peak above the baseline; the others are one band."""
    band_of = _band_of(tracker)
    names = list(dict.fromkeys([BASELINE_BAND, *band_of.values()]))
    index = {name: i for i, name in enumerate(names)}
    steps = tracker.steps
    deltas = np.zeros((len(names), len(steps)), dtype=np.float64)
    for i, (_, step) in enumerate(steps):
        storage = tracker.storages[abs(step)]
        deltas[index[band_of[abs(step)]], i] = storage.nbytes if step > 0 else -storage.nbytes
    live = np.cumsum(deltas, axis=1)
    above = max(tracker.peak_bytes - tracker.baseline_bytes, 1)
    highest = live.max(axis=1, initial=0)
    ranked = sorted((i for i in range(1, len(names)) if highest[i] >= least * above), key=lambda i: -highest[i])
    top = ranked[:bands]
    rest = [i for i in range(1, len(names)) if i not in top]
    rows = [live[0], *(live[i] for i in top)] + ([live[rest].sum(axis=0)] if rest else [])
    stacked = np.vstack(rows) if len(steps) else np.zeros((len(rows), 0))
    chosen = _highest_per_op(np.array([op for op, _ in steps], dtype=np.int64), stacked.sum(axis=0))
    labels = [BASELINE_BAND, *(names[i] for i in top)] + ([OTHER_BAND] if rest else [])
    peak_op = int(steps[tracker.peak_at - 1][0]) if tracker.peak_at else 0
    at_peak = stacked[:, tracker.peak_at - 1] if tracker.peak_at else np.zeros(len(labels))
    ops = np.array([steps[i][0] for i in chosen], dtype=np.int64)
    return Series(ops, labels, stacked[:, chosen], tracker.backward_from, peak_op, tracker.peak_bytes, at_peak)


def _highest_per_op(ops: np.ndarray, totals: np.ndarray, points: int = POINTS) -> list[int]:
    """For each span of ops (each op, or ``len / points`` of them on a long iteration), the step at which the total
    was highest: a storage that lives for a few ops stays visible, whatever the iteration's length."""
    span = max(1, -(-int(ops.max(initial=0)) // points))
    chosen: list[int] = []
    for i, op in enumerate(ops):
        if chosen and ops[chosen[-1]] // span == op // span:
            if totals[i] > totals[chosen[-1]]:
                chosen[-1] = i
        else:
            chosen.append(i)
    return chosen


def _unit(peak: float) -> tuple[float, str]:
    for size, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if peak >= 2 * size:
            return size, name
    return 1, "B"


def _legend(band: str) -> str:
    if band in (BASELINE_BAND, OTHER_BAND):
        return band
    code = code_line(band)
    code = code if len(code) <= 40 else code[:37] + "..."
    return f"{band.rpartition('/')[2]}  {code}"


def render(data: Series, title: str) -> bytes:
    """The figure as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    scale, unit = _unit(data.peak_bytes)
    fig, (ax, bar) = plt.subplots(1, 2, figsize=(6.7, 4.8), dpi=200, sharey=True,
                                  gridspec_kw={"width_ratios": [14, 1], "wspace": 0.04})
    palette = iter(plt.get_cmap("tab10").colors)
    colors = [{BASELINE_BAND: "#bdbdbd", OTHER_BAND: "#e8d5a9"}.get(b) or next(palette) for b in data.bands]
    ax.stackplot(data.ops, data.live / scale, labels=[_legend(b) for b in data.bands], colors=colors,
                 step="post", linewidth=0)
    end = int(data.ops.max()) if len(data.ops) else 1
    if data.backward_from is not None:
        ax.axvspan(data.backward_from, end, color="#4a6fa5", alpha=0.08, linewidth=0)
        ax.text(data.backward_from, 1.0, " backward", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.text(0, 1.0, " forward", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.axvline(data.peak_op, color="#c0392b", linestyle="--", linewidth=1)
    ax.annotate(f"peak {data.peak_bytes / scale:.3g} {unit}", xy=(data.peak_op, data.peak_bytes / scale),
                xytext=(4, -12), textcoords="offset points", color="#c0392b", fontsize=8)
    ax.set_xlim(0, end)
    ax.set_ylim(0, data.peak_bytes / scale * 1.08)
    ax.set_xlabel("aten ops of one iteration, in the order they ran (each span at its highest)", fontsize=9)
    ax.set_ylabel(f"live memory ({unit})", fontsize=9)
    ax.set_title(title, fontsize=9, loc="left")
    ax.tick_params(labelsize=8)
    # The peak's own composition: a storage that lives for a few ops among thousands is a sliver on the left.
    bar.bar([0], data.at_peak / scale, bottom=np.concatenate([[0], np.cumsum(data.at_peak)[:-1]]) / scale,
            color=colors, width=0.8)
    bar.set_xticks([0], ["at the\npeak"], fontsize=7)
    bar.tick_params(left=False, labelleft=False)
    bar.set_xlim(-0.6, 0.6)
    handles, labels_ = ax.get_legend_handles_labels()
    rows = -(-len(data.bands) // 2)
    fig.legend(handles[::-1], labels_[::-1], loc="lower left", ncol=2, fontsize=6.5, frameon=False,
               bbox_to_anchor=(0.01, 0.0), columnspacing=1.0, handlelength=1.2)
    fig.subplots_adjust(left=0.1, right=0.98, top=0.93, bottom=0.13 + 0.036 * rows)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def write(path: Path, tracker: Attribution, title: str) -> None:
    fileio.write_atomic(path, render(series(tracker), title))
