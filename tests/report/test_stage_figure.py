"""The per-stage figure (report/plots/stages.py): drawn where rows carry per-stage columns, stacked times and side by
side peaks per method and size; not drawn for rows without them."""

import json

import matplotlib
import pandas as pd

from topk_bench.report.plots import stages
from topk_bench.report.plots.spec import PlotSpec
from topk_bench.results import columns as col

SPEC = PlotSpec(suite="stages", title="Per-stage cost", workload="mha", x="seq_len", x_label="sequence length")
TIMES = {"forward.indexer": 1.0, "forward.selection": 0.5, "forward.attention": 0.25, "backward.attention": 1.0}
PEAKS = {"forward.indexer": 300, "forward.selection": 200, "forward.attention": 150, "backward.attention": 250}


def _rows(with_stages: bool = True) -> pd.DataFrame:
    rows = []
    for impl in ("dsa", "vanilla"):
        for seq_len in (512, 1024):
            staged = with_stages and impl == "dsa"
            rows.append(
                {
                    col.IMPL: impl,
                    col.LABEL: "",
                    col.STATUS: "ok",
                    "seq_len": seq_len,
                    col.TIME_MEDIAN_S: 3.0,
                    col.PEAK_BYTES: 300,
                    col.BASELINE_BYTES: 100,
                    col.STAGE_TIMES_S: json.dumps(TIMES) if staged else "",
                    col.STAGE_PEAK_BYTES: json.dumps(PEAKS) if staged else "",
                }
            )
    return pd.DataFrame(rows)


def test_the_figure_is_wanted_only_where_rows_carry_stages():
    assert stages.wanted(_rows())
    assert not stages.wanted(_rows(with_stages=False))
    assert not stages.wanted(_rows().drop(columns=list(col.STAGE_COLUMNS)))


def test_times_are_stacked_with_the_rest_of_the_iteration_and_peaks_stand_side_by_side():
    fig = stages.draw(_rows(), SPEC, "cpu", "measured")
    times, peaks = fig.axes[:2]
    bars = [p for p in times.patches if isinstance(p, matplotlib.patches.Rectangle)]
    # Per size, one bar of dsa: four stages and the rest (3.0 s median - 2.75 s in stages), stacked to the median.
    assert len(bars) == 2 * 5
    tops = sorted({round(b.get_y() + b.get_height(), 9) for b in bars})
    assert tops[-1] == 3.0 and 2.75 in tops
    # Peaks above the baseline, one bar per stage side by side (not stacked: every bar starts at 0).
    peak_bars = [p for p in peaks.patches if isinstance(p, matplotlib.patches.Rectangle)]
    assert len(peak_bars) == 2 * 4 and all(b.get_y() == 0 for b in peak_bars)
    assert max(b.get_height() for b in peak_bars) == (300 - 100) / 2**20
    # vanilla has no stages: it is not in this figure.
    assert all("vanilla" not in t.get_text() for t in times.get_xticklabels())
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:4] == ["forward indexer", "forward selection", "forward attention", "backward attention"]
