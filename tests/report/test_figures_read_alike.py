"""Figures that do not mislead: one colour and marker per implementation in every figure, variants by shade and
line style that the legend's handles draw; curves that coincide both visible; a point beyond the frame never
joined to its curve by a line that levels off; memory in the unit that fits, plain tick labels; titles that say
each thing once and match the axes."""

from __future__ import annotations

import json

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pytest

from locations import ROOT
from topk_bench.case import Case, Measurement
from topk_bench.report.plots import palette
from topk_bench.report.plots.figure import draw_figure
from topk_bench.report.plots.inputs import figure_inputs
from topk_bench.results.columns import header as results_header
from topk_bench.results.columns import order_parameters
from topk_bench.results.row import make_row, parameters
from topk_bench.results.store import append_row

GIB, KIB = 2**30, 2**10
BUDGET = type("B", (), {"max_memory_bytes": 30 * GIB, "max_seconds": 60.0})()


def _case(impl, seq_len, label=None, **options):
    return Case.make(
        suite="mha",
        workload="mha",
        impl=impl,
        label=label or impl,
        device="cpu",
        method="predicted",
        params={"seq_len": seq_len},
        options=options,
    )


def _figure(tmp_path, points, title="MHA at {seq_len} tokens", **plot):
    out = tmp_path / "r"
    out.mkdir(exist_ok=True)
    header = results_header(order_parameters(k for case, _ in points for k in parameters(case)), ())
    for case, measurement in points:
        header = append_row(out / "mha.csv", make_row(case, measurement, budget=BUDGET), header)
    (out / "mha.meta.json").write_text(
        json.dumps(
            {
                "suite": "mha",
                "title": title,
                "workload": "mha",
                "plot": {"x": "seq_len", "log_x": 2, "metrics": ["memory"], **plot},
            }
        )
    )
    (item,) = figure_inputs(out)
    return draw_figure(item.rows, item.spec, item.device, item.method)


def _peak(bytes_, status="ok"):
    return Measurement(status=status, device_name="cpu", peak_bytes=int(bytes_))


def _curves(ax):
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def _legend(fig):
    return [t.get_text().replace("\n", " ") for t in fig.legends[0].get_texts()]


def test_one_colour_and_marker_per_method_the_authors_code_dashed_in_it():
    assert palette.impl_style("vanilla") == palette.impl_style("vanilla_paper") == ("#1f77b4", "o")
    assert palette.series_style("vanilla", 0).dashes is None and palette.series_style("vanilla_paper", 0).dashes
    assert palette.impl_style("topk") != palette.impl_style("vanilla")
    # Every method of the project has its own, and a plug-in's comes from spares none of them take.
    known = list(palette.KNOWN.values())
    assert len(set(known)) == len(known) == len({c for c, _ in known}) == len({m for _, m in known})
    assert palette.impl_style("my_plugin")[0] in palette.SPARE_COLOURS
    assert palette.impl_style("my_plugin")[1] in palette.SPARE_MARKERS
    assert not set(palette.SPARE_MARKERS) & {m for _, m in known} and "X" not in palette.SPARE_MARKERS
    # The variants of one implementation in a figure: each a shade and a line style of its own.
    styles = [palette.series_style("page_topk", n) for n in range(3)]
    assert len({(s.colour, s.dashes) for s in styles}) == 3 and len({s.colour for s in styles}) == 3


def test_every_registered_built_in_has_a_colour_and_marker_of_its_own():
    """Each implementation the project registers (a plug-in's registers elsewhere) is drawn as itself, never with a
    plug-in's spare colour and marker: its method's entry in the palette, no two methods sharing a colour or a
    marker."""
    import topk_bench.attention

    built_ins = {s.name for s in topk_bench.attention.all_specs() if s.fn.__module__.startswith("implementations.")}
    methods = {palette.method(name) for name in built_ins}
    assert methods - set(palette.KNOWN) == set()
    styles = [palette.impl_style(name) for name in methods]
    assert len({c for c, _ in styles}) == len({m for _, m in styles}) == len(methods)
    assert not {c for c, _ in styles} & set(palette.SPARE_COLOURS)


def test_the_docs_figures_draw_each_method_alike(tmp_path):
    """vanilla is blue in `mha` and in `paper_mha` (there its authors' code, dashed)."""
    colours = {}
    for name in ("mha", "paper_mha"):
        fig = draw_figure(*_args(name))
        try:
            lines = _curves(fig.axes[0])
            colours[name] = {label.split(" (")[0]: mcolors.to_hex(line.get_color()) for label, line in lines.items()}
            dashed = {label.split(" (")[0]: line.get_linestyle() != "-" for label, line in lines.items()}
            assert fig.legends[0].handlelength >= 3  # long enough to draw the dashes
        finally:
            plt.close(fig)
        if name == "paper_mha":
            assert dashed["Vanilla"] and not dashed["Performer"]
    for method in ("Vanilla", "Top-k", "Performer", "Q-chunking"):
        assert colours["mha"][method] == colours["paper_mha"][method], method


def _args(name):
    item = next(i for i in figure_inputs(ROOT / "docs" / "figures" / "data") if i.spec.suite == name)
    return item.rows, item.spec, item.device, item.method


def test_a_peak_far_above_the_frame_is_on_its_edge_past_a_break_and_the_curve_rises_towards_its_value(tmp_path):
    points = [
        (_case("vanilla", 4096), _peak(2.3 * GIB)),
        (_case("vanilla", 8192), _peak(9.2 * GIB)),
        (_case("vanilla", 16384), _peak(36.5 * GIB, "over_budget")),
        (_case("sdpa", 16384), _peak(0.5 * GIB)),
    ]
    fig = _figure(tmp_path, points, log_y=False)
    try:
        (ax,) = fig.axes
        top = ax.get_ylim()[1]
        (cross,) = [line for line in ax.get_lines() if line.get_marker() == "X"]
        assert cross.get_transform() == ax.get_xaxis_transform() and list(cross.get_ydata()) == [1.0]
        # The line from 9.2 GiB goes towards 36.5 GiB, far above the frame: it leaves it, it does not level off.
        (towards,) = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert list(towards.get_ydata()) == [pytest.approx(9.2), pytest.approx(36.5)] and top < 15
        # No line reaches the cross at the edge's height: nothing else ends at x = 16K.
        assert not any(
            line.get_linestyle() != "None"
            and line.get_xdata()[-1] == pytest.approx(16384, rel=0.1)
            and line is not towards
            for line in ax.get_lines()
            if len(line.get_xdata()) > 1
        )
        assert "over budget (36.5 GiB)" in [t.get_text() for t in ax.texts]
        breaks = [line for line in ax.get_lines() if line.get_transform() == ax.transAxes]
        assert len(breaks) == 2  # the two strokes of the break in the y axis
    finally:
        plt.close(fig)


def test_memory_in_the_unit_that_fits_with_plain_tick_labels(tmp_path):
    points = [(_case("sdpa", n), _peak(40 * KIB * n / 1024)) for n in (1024, 4096, 16384)]
    fig = _figure(tmp_path, points, log_y=True)
    try:
        (ax,) = fig.axes
        assert ax.get_ylabel() == "peak allocated memory (KiB)"
        assert list(_curves(ax)["sdpa"].get_ydata()) == [pytest.approx(40), pytest.approx(160), pytest.approx(640)]
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]
        assert labels and not any("$" in label or "10^" in label or "×" in label for label in labels), labels
        assert {"100", "1000"} <= set(labels) or {"50", "100", "200", "500"} & set(labels)
    finally:
        plt.close(fig)


def test_curves_that_coincide_are_drawn_side_by_side_and_the_legend_says_so(tmp_path):
    sizes = (1024, 4096, 16384, 65536)
    points = [(_case("topk", n, "Top-k"), _peak(n * 1e5)) for n in sizes]
    points += [(_case("performer", n, "Performer"), _peak(n * 1.001e5)) for n in sizes]
    points += [(_case("vanilla", n, "Vanilla"), _peak(n * 9e5)) for n in sizes]
    fig = _figure(tmp_path, points, log_y=True)
    try:
        (ax,) = fig.axes
        curves = _curves(ax)
        assert curves["Performer"].get_transform() != ax.transData  # shifted beside Top-k
        assert curves["Top-k"].get_transform() == ax.transData and curves["Vanilla"].get_transform() == ax.transData
        shown = [ax.transData.transform((x, y)) for x, y in curves["Top-k"].get_xydata()]
        beside = curves["Performer"].get_transform().transform(curves["Performer"].get_xydata())
        assert all(np.hypot(*(a - b)) >= 5 for a, b in zip(shown, beside))  # a marker apart, in pixels
        assert (
            "Top-k, Performer: peak allocated memory too close to tell apart at this scale (drawn side by side)"
            in _legend(fig)
        )
    finally:
        plt.close(fig)


def test_the_title_says_what_the_rows_have_and_each_thing_once(tmp_path):
    points = [(_case("sdpa", n), _peak(n * 1e5)) for n in (256, 512, 1024)]
    fig = _figure(tmp_path, points, x_label="length (of {seq_len})")
    try:
        title = fig._suptitle.get_text()
        assert title == "MHA at 256 to 1K tokens\npredicted: allocated bytes, nothing computed"
        assert "full scale" not in title and fig.axes[0].get_xlabel() == "length (of 256 to 1K)"
    finally:
        plt.close(fig)


def test_the_title_names_the_peak_the_memory_panel_draws(tmp_path):
    """A prediction drawing reserved bytes (CUDA: the simulated caching allocator) says so above its panels, as
    its y label does; one without reserved peaks draws, and says, allocated bytes."""
    reserved = [
        (_case("sdpa", n), Measurement(status="ok", device_name="cpu", peak_bytes=int(n * 1e5), reserved_bytes=2**21))
        for n in (256, 512)
    ]
    fig = _figure(tmp_path, reserved, memory="reserved")
    try:
        assert fig._suptitle.get_text().endswith(
            "predicted: reserved bytes (the caching allocator simulated), nothing computed"
        )
        assert "reserved" in fig.axes[0].get_ylabel()
    finally:
        plt.close(fig)
    (tmp_path / "allocated").mkdir()
    fig = _figure(tmp_path / "allocated", [(_case("sdpa", n), _peak(n * 1e5)) for n in (256, 512)], memory="reserved")
    try:
        assert fig._suptitle.get_text().endswith("predicted: allocated bytes, nothing computed")
        assert "reserved" not in fig.axes[0].get_ylabel()
    finally:
        plt.close(fig)


def test_the_pareto_figures_title_is_its_own():
    """Quality against time per token: not the suite's title, which says "against the token budget"."""
    item = next(i for i in figure_inputs(ROOT / "docs" / "figures" / "data") if i.spec.suite == "kv_selection")
    from topk_bench.report.plots import pareto

    fig = pareto.draw(item.rows, item.spec, item.device, item.method)
    try:
        first = fig._suptitle.get_text().splitlines()[0]
        assert "against the token budget" not in first and "against time per token" in first
    finally:
        plt.close(fig)


def test_plot_of_results_draws_runs_only_the_baselines_live_apart():
    assert (ROOT / "baselines" / "ci-predicted.csv").is_file()
    assert not (ROOT / "results" / "baselines").exists()
    assert "baselines/ci-predicted.csv" in (ROOT / ".ci" / "run").read_text()
