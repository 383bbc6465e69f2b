"""``timeline.png`` of a profile: live bytes over the iteration's ops, stacked by source line, as memory_viz's
active memory, drawn from the ``timeline.json`` the child wrote (:mod:`topk_bench.capture.timeline`).

The x axis counts the aten ops the iteration dispatched (forward, then backward, shaded); each band is
one source line's live storages (the largest lines at the peak; the rest as one band); the inputs and
parameters lie at the bottom. The peak is marked. Sized to be read on a printed page (17 cm wide).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from topk_bench import fileio
from topk_bench.capture import timeline
from topk_bench.capture.sources import code_line
from topk_bench.capture.timeline import BASELINE_BAND, OTHER_BAND, Series
from topk_bench.units import GIB, KIB, MIB
from topk_bench.untrusted import figure

DATA = "timeline.json"
FIGURE = "timeline.png"


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
    fig, (ax, bar) = plt.subplots(
        1, 2, figsize=(6.7, 4.8), dpi=200, sharey=True, gridspec_kw={"width_ratios": [14, 1], "wspace": 0.04}
    )
    palette = iter(plt.get_cmap("tab10").colors)  # type: ignore[attr-defined]  # tab10 is a ListedColormap
    colors = [{BASELINE_BAND: "#bdbdbd", OTHER_BAND: "#e8d5a9"}.get(b) or next(palette) for b in data.bands]
    ax.stackplot(
        data.ops,
        data.live / scale,
        labels=[figure(_legend(b)) for b in data.bands],  # lines of code: a "$" in one is no mathtext
        colors=colors,
        step="post",
        linewidth=0,
    )
    end = int(data.ops.max()) if len(data.ops) else 1
    if data.backward_from is not None:
        ax.axvspan(data.backward_from, end, color="#4a6fa5", alpha=0.08, linewidth=0)
        ax.text(data.backward_from, 1.0, " backward", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.text(0, 1.0, " forward", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.axvline(data.peak_op, color="#c0392b", linestyle="--", linewidth=1)
    ax.annotate(
        f"peak {data.peak_bytes / scale:.3g} {unit}",
        xy=(data.peak_op, data.peak_bytes / scale),
        xytext=(4, -12),
        textcoords="offset points",
        color="#c0392b",
        fontsize=8,
    )
    ax.set_xlim(0, end)
    ax.set_ylim(0, data.peak_bytes / scale * 1.08)
    ax.set_xlabel("aten ops of one iteration, in the order they ran (each span at its highest)", fontsize=9)
    ax.set_ylabel(f"live memory ({unit})", fontsize=9)
    ax.set_title(figure(title), fontsize=9, loc="left")
    ax.tick_params(labelsize=8)
    # The peak's own composition: a storage that lives for a few ops among thousands is a sliver on the left.
    bar.bar(
        [0],
        data.at_peak / scale,
        bottom=np.concatenate([[0], np.cumsum(data.at_peak)[:-1]]) / scale,
        color=colors,
        width=0.8,
    )
    bar.set_xticks([0], ["at the\npeak"], fontsize=7)
    bar.tick_params(left=False, labelleft=False)
    bar.set_xlim(-0.6, 0.6)
    handles, labels_ = ax.get_legend_handles_labels()
    rows = -(-len(data.bands) // 2)
    fig.legend(
        handles[::-1],
        labels_[::-1],
        loc="lower left",
        ncol=2,
        fontsize=6.5,
        frameon=False,
        bbox_to_anchor=(0.01, 0.0),
        columnspacing=1.0,
        handlelength=1.2,
    )
    fig.subplots_adjust(left=0.1, right=0.98, top=0.93, bottom=0.13 + 0.036 * rows)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def draw(directory: Path) -> str:
    """``timeline.png`` beside the ``timeline.json`` of the profile in ``directory``. Returns "" when drawn, or when
    the profile has no timeline (a compiled call's), else one line saying why not: a figure is not worth the
    profile, whose other files stand, and the caller warns."""
    source = directory / DATA
    if not source.is_file():
        return ""
    try:
        data, title = timeline.read(source)
        fileio.write_atomic(directory / FIGURE, render(data, title))
    except Exception as exc:  # noqa: BLE001 -- any failure to draw is the one line
        return f"{directory / FIGURE} not drawn: {type(exc).__name__}: {exc}"
    return ""
