"""The pretrained suite's figure: fidelity against k for top-k at attention and at FF, others as reference lines.

A plug-in renderer of :mod:`topk_bench.report.plots.figure` (``renderer =
"topk_bench.report.plots.fidelity:render"`` in the suite's ``[plot]``). One panel per
fidelity metric. A curve's k is ``ff_topk`` when its FF is top-k, else
``topk``; an implementation without k (Performer) is a horizontal line at its
mean, as in the paper's comparison with a fixed 256-feature Performer.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from topk_bench.report.plots import scales
from topk_bench.report.plots.spec import PlotSpec
from topk_bench.results import columns as col
from topk_bench.results.columns import metric
from topk_bench.status import Status
from topk_bench.untrusted import figure

FIDELITY_METRICS = (col.EMB_COS, col.NN_AGREE, col.NN_SPEARMAN, col.REL_ERR, col.GRAD_COS)


def k_column(group: pd.DataFrame) -> str | None:
    """The column holding this curve's k, or None for a reference line."""
    for column in ("ff_topk", "topk"):
        if column in group and group[column].notna().any():
            if column == "topk" and "ff_impl" in group and group["ff_impl"].notna().any():
                continue  # k belongs to the FF here
            if column == "topk" and not group["options_have_topk"].any():
                continue  # a swept parameter the implementation ignores (Performer's repeats)
            return column
    return None


def _with_option_flag(rows: pd.DataFrame) -> pd.DataFrame:
    import topk_bench.attention  # the registry (torch) only for this renderer: `topk-bench plot` stays light

    def has_topk(name) -> bool:
        try:
            return "topk" in topk_bench.attention.spec(str(name)).options
        except KeyError:
            return False

    return rows.assign(options_have_topk=rows[col.IMPL].map(has_topk))


def render(rows: pd.DataFrame, spec: PlotSpec, device: str, method: str) -> Figure:
    metrics = [m for m in spec.metrics if m in FIDELITY_METRICS and m in rows and rows[m].notna().any()]
    metrics = metrics or [m for m in FIDELITY_METRICS if m in rows and rows[m].notna().any()]
    ok = _with_option_flag(rows[rows[col.STATUS] == Status.OK])
    labels = pd.Series(col.legends(ok), index=ok.index)
    fig, axes = plt.subplots(
        1, max(len(metrics), 1), figsize=(4.2 * max(len(metrics), 1), 3.6), squeeze=False, layout="constrained"
    )
    for ax, name in zip(axes[0], metrics):
        for i, (label, group) in enumerate(ok.groupby(labels, sort=False)):
            color = f"C{i}"
            column = k_column(group)
            if column is None:
                ax.axhline(group[name].mean(), color=color, linestyle="--", label=figure(label))
                continue
            curve = group.sort_values(column)
            ax.plot(curve[column], curve[name], marker="o", markersize=4, color=color, label=figure(label))
        if spec.log_x:
            ax.set_xscale("log", base=spec.log_x)
        ax.set_xlabel(figure(spec.x_label or "k"))
        ax.set_ylabel(metric(name).label)
        ax.grid(True, alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 3) or 1, fontsize=8, frameon=False)
    fig.suptitle(figure(f"{scales.filled(spec.title, rows)} — {device}"), fontsize=10)
    return fig
