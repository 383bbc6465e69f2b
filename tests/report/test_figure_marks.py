"""What a figure's marks mean (issue 30): hollow = a time measured under contention, on time panels only;
the legend explains every encoding; the memory budget drawn where it matters; the quality-against-time
(Pareto) figure draws the CSV's own numbers."""

from __future__ import annotations

import json

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from locations import ROOT
from topk_bench.case import Case, Measurement
from topk_bench.report.plots import marks, pareto
from topk_bench.report.plots.figure import PREDICTED_OVER_LEGEND, draw_figure, plot_results
from topk_bench.report.plots.inputs import figure_inputs
from topk_bench.report.plots.palette import impl_style
from topk_bench.results import columns as col
from topk_bench.results.columns import header as results_header
from topk_bench.results.columns import order_parameters
from topk_bench.results.frame import load_results
from topk_bench.results.row import make_row, parameters
from topk_bench.results.store import append_row
from topk_bench.workloads import traffic

GIB = 2**30
QUIET, BUSY = 0.2, 1.8  # load per core at the measurement's start: below and above trust's threshold


def _write(path, points, with_traffic=False, budget=None):
    """The CSV a run writes: one ``append_row`` per case through the real row writer."""
    header = results_header(
        order_parameters(k for case, _ in points for k in parameters(case)),
        sorted({k for _, m in points for k in m.extra}),
    )
    for case, measurement in points:
        row = make_row(case, measurement, traffic=traffic(case) if with_traffic else None, budget=budget)
        header = append_row(path, row, header)


def _mha(impl, label, seq_len, peak_gib, seconds, load, method="measured", status="ok"):
    case = Case.make(
        suite="mha", workload="mha", impl=impl, label=label, device="cpu", method=method, params={"seq_len": seq_len}
    )
    times = [] if seconds is None else [0.95 * seconds, seconds, 1.05 * seconds]
    return case, Measurement(
        status=status,
        device_name="test cpu",
        peak_bytes=int(peak_gib * GIB),
        times_s=times,
        metadata={"load_start": load, "load_end": load},
    )


def _figure(out, metrics=("memory", "time"), **plot):
    (out / "mha.meta.json").write_text(
        json.dumps(
            {
                "suite": "mha",
                "title": "MHA",
                "workload": "mha",
                "plot": {"x": "seq_len", "log_x": 2, "metrics": list(metrics), **plot},
            }
        )
    )
    (item,) = figure_inputs(out)
    return draw_figure(item.rows, item.spec, item.device, item.method)


def _legend(fig) -> list[str]:
    return [t.get_text().replace("\n", " ") for t in fig.legends[0].get_texts()]  # wrapped to the columns


def _hollow_points(ax) -> list[tuple[float, float]]:
    """The points drawn with a white face: hollow."""
    return [
        (float(x), float(y))
        for line in ax.get_lines()
        if line.get_markerfacecolor() == "white"
        for x, y in zip(line.get_xdata(), line.get_ydata())
    ]


def _filled(line) -> bool:
    return line.get_fillstyle() == "full" and mcolors.same_color(line.get_markerfacecolor(), line.get_color())


def test_a_contended_time_is_hollow_its_memory_filled_and_sdpa_filled_when_not(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    _write(
        out / "mha.csv",
        [
            _mha("sdpa", "SDPA", 512, 0.1, 0.010, QUIET),
            _mha("sdpa", "SDPA", 1024, 0.2, 0.030, BUSY),
            _mha("vanilla", "Vanilla", 512, 0.2, 0.020, QUIET),
            _mha("vanilla", "Vanilla", 1024, 0.8, 0.060, QUIET),
        ],
    )
    rows = load_results(out)
    assert list(rows[col.TRUST]) == ["", "busy", "", ""]  # the writer's own flag, from the load
    fig = _figure(out)
    try:
        memory, time = fig.axes
        # Peaks of 0.1 to 0.8 GiB: drawn in MiB, the unit that fits them.
        assert (memory.get_ylabel(), time.get_ylabel()) == ("peak allocated memory (MiB)", "time (s)")
        # The contended case: hollow on the time panel, at its time; its memory point is exact: filled.
        ((x, y),) = _hollow_points(time)
        assert x == pytest.approx(1024, rel=0.05) and y == pytest.approx(0.030)
        assert _hollow_points(memory) == []
        # SDPA and vanilla lines keep filled markers in both panels: no implementation is hollow by style.
        for ax in (memory, time):
            curves = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
            assert set(curves) == {"SDPA", "Vanilla"} and all(_filled(line) for line in curves.values())
            assert curves["SDPA"].get_marker() != curves["Vanilla"].get_marker()
        assert marks.HOLLOW_LEGEND in _legend(fig) and marks.IQR_LEGEND in _legend(fig)
    finally:
        plt.close(fig)


def test_nothing_hollow_and_no_hollow_entry_on_a_quiet_run_or_a_memory_only_figure(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    _write(
        out / "mha.csv",
        [_mha("sdpa", "SDPA", 512, 0.1, 0.010, QUIET), _mha("performer", "Performer", 512, 0.1, 0.010, QUIET)],
    )
    fig = _figure(out)
    try:
        assert all(_hollow_points(ax) == [] for ax in fig.axes)
        assert marks.HOLLOW_LEGEND not in _legend(fig)
    finally:
        plt.close(fig)
    busy = tmp_path / "busy"
    busy.mkdir()
    _write(busy / "mha.csv", [_mha("sdpa", "SDPA", 512, 0.1, 0.010, BUSY)])
    fig = _figure(busy, metrics=("memory",))
    try:  # contended, but no panel of time: nothing hollow, and the legend does not explain what is not drawn
        assert _hollow_points(fig.axes[0]) == [] and marks.HOLLOW_LEGEND not in _legend(fig)
    finally:
        plt.close(fig)


def test_every_encoding_is_explained_a_predicted_over_budget_peak_at_its_value_and_the_budget_drawn(tmp_path):
    """The demo's Fig. 1: vanilla predicted over the 30 GiB budget at 16K (exact: drawn at 36.5 GiB, never
    called failed), the budget line drawn, the skipped size said in words."""
    out = tmp_path / "r"
    out.mkdir()
    budget = type("B", (), {"max_memory_bytes": 30 * GIB, "max_seconds": 60.0})()
    points = [
        _mha("vanilla", "Vanilla", 1024, 0.2, None, None, "predicted"),
        _mha("vanilla", "Vanilla", 4096, 2.3, None, None, "predicted"),
        _mha("vanilla", "Vanilla", 16384, 36.5, None, None, "predicted", "over_budget"),
        _mha("vanilla", "Vanilla", 65536, 0, None, None, "predicted", "skipped"),
        *[_mha("sdpa", "SDPA", n, 0.05 * n / 1024, None, None, "predicted") for n in (1024, 4096, 16384, 65536)],
    ]
    _write(out / "mha.csv", points, budget=budget)
    fig = _figure(out, metrics=("memory",), log_y=True)
    try:
        (ax,) = fig.axes
        budget_lines = [line for line in ax.get_lines() if list(line.get_ydata()) == [30.0, 30.0]]
        assert len(budget_lines) == 1 and budget_lines[0].get_linestyle() == "-."
        crosses = [line for line in ax.get_lines() if line.get_marker() == "X"]
        assert len(crosses) == 1 and list(crosses[0].get_ydata()) == [pytest.approx(36.5)]
        assert crosses[0].get_transform() == ax.transData  # at its value, not on the frame's edge
        assert "over budget (36.5 GiB)" in [t.get_text() for t in ax.texts]
        legend = _legend(fig)
        assert legend == [
            "Vanilla",
            "SDPA",
            "dash-dot: the memory budget (30 GiB)",
            PREDICTED_OVER_LEGEND,
            "not shown: 1 larger case(s), not run after a smaller one went over the memory budget",
        ]
        assert not any("fail" in entry for entry in legend)
    finally:
        plt.close(fig)


def test_on_a_linear_axis_far_below_the_budget_an_over_budget_peak_is_a_named_cross_on_the_top_edge(tmp_path):
    """Fig. 1's linear long-length panel: curves up to 9 GiB, vanilla's 36.5 GiB over the 30 GiB budget. A budget
    line would squash the curves: the cross sits on the top edge, its peak written, the legend naming the budget."""
    out = tmp_path / "r"
    out.mkdir()
    budget = type("B", (), {"max_memory_bytes": 30 * GIB, "max_seconds": 60.0})()
    points = [
        _mha("vanilla", "Vanilla", 4096, 2.3, None, None, "predicted"),
        _mha("vanilla", "Vanilla", 8192, 9.2, None, None, "predicted"),
        _mha("vanilla", "Vanilla", 16384, 36.5, None, None, "predicted", "over_budget"),
        _mha("sdpa", "SDPA", 16384, 0.5, None, None, "predicted"),
    ]
    _write(out / "mha.csv", points, budget=budget)
    fig = _figure(out, metrics=("memory",), log_y=False)
    try:
        (ax,) = fig.axes
        assert not [line for line in ax.get_lines() if list(line.get_ydata()) == [30.0, 30.0]]
        (cross,) = [line for line in ax.get_lines() if line.get_marker() == "X"]
        assert cross.get_transform() == ax.get_xaxis_transform() and ax.get_ylim()[1] < 15
        assert "over budget (36.5 GiB)" in [t.get_text() for t in ax.texts]
        assert "over the memory budget (30 GiB): beyond the frame, on its top edge (its peak written)" in _legend(fig)
    finally:
        plt.close(fig)


def test_many_metrics_of_one_range_are_a_grid_with_every_panel_labelled(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    _write(out / "mha.csv", [_mha("sdpa", "SDPA", n, 0.1, 0.01, QUIET) for n in (512, 1024)])
    fig = _figure(out, metrics=("memory", "time", "time_mean", "flops"))
    try:
        width, height = fig.get_size_inches()
        assert len(fig.axes) == 3 and width > 8  # flops has no values: memory, time, time_mean in two columns
        positions = sorted((round(ax.get_position().y0, 2), round(ax.get_position().x0, 2)) for ax in fig.axes)
        assert len({x for _, x in positions}) == 2 and len({y for y, _ in positions}) == 2
        assert all(ax.get_ylabel() for ax in fig.axes)
    finally:
        plt.close(fig)


# --- the quality-against-time figure -------------------------------------------------------------------

BUDGETS = (2048, 4096, 8192)


def _decode(impl, label, budget, seconds, minilm_mass, minilm_err, load=QUIET, **options):
    case = Case.make(
        suite="kv",
        workload="decode",
        impl=impl,
        label=label,
        method="measured",
        dtype="bfloat16",
        mode="fwd",
        causal=True,
        options=options,
        params=dict(
            model="llama-3-8b",
            kv_len=131072,
            new_tokens=1,
            budget=budget,
            batch=1,
            q_heads=32,
            kv_heads=8,
            head_dim=128,
        ),
    )
    extra = {
        col.MASS_RECALL: budget / 131072,
        col.ATTN_REL_ERR: 1 - budget / 131072,
        "minilm_mass_recall": minilm_mass,
        "minilm_attn_rel_err": minilm_err,
    }
    return case, Measurement(
        status="ok",
        device_name="test cpu",
        peak_bytes=GIB,
        baseline_bytes=GIB // 2,
        times_s=[seconds] * 3,
        extra=extra,
        metadata={"load_start": load, "load_end": load},
    )


@pytest.fixture
def selection(tmp_path):
    """A kv_selection-like results folder: dense vanilla (quality the same at every budget), two selection
    methods whose quality grows with the budget, one time measured under contention, one timeout."""
    out = tmp_path / "r"
    out.mkdir()
    points = [_decode("vanilla", "Vanilla", b, 0.050 + 0.001 * i, 1.0, 0.004) for i, b in enumerate(BUDGETS)]
    points += [
        _decode("topk_fast", "topk_fast", b, 0.030 + 0.005 * i, 0.4 + 0.1 * i, 0.8 - 0.2 * i, topk=b)
        for i, b in enumerate(BUDGETS)
    ]
    points += [
        _decode(
            "page_topk",
            "page_topk (page 16)",
            b,
            0.010 * (i + 1),
            0.3 + 0.15 * i,
            0.9 - 0.3 * i,
            load=BUSY if b == 4096 else QUIET,
            page_size=16,
            token_budget=b,
        )
        for i, b in enumerate(BUDGETS)
    ]
    timeout = _decode("sink_window", "sink_window", 2048, 0.01, 0.2, 1.0, window=2048)
    timeout[1].status, timeout[1].times_s, timeout[1].extra = "timeout", [], {}
    _write(out / "kv.csv", [*points, timeout], with_traffic=True)
    (out / "kv.meta.json").write_text(
        json.dumps(
            {
                "suite": "kv",
                "title": "KV selection",
                "workload": "decode",
                "plot": {
                    "x": "budget",
                    "x_label": "token budget",
                    "log_x": 2,
                    "pareto": True,
                    "metrics": ["time_per_token", "minilm_mass_recall"],
                },
            }
        )
    )
    return out


def test_the_pareto_figure_draws_the_csvs_points(selection, tmp_path):
    written = plot_results(selection, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["kv-cpu-measured.png", "kv-pareto-cpu-measured.png"]
    rows = load_results(selection)
    (item,) = figure_inputs(selection)
    assert pareto.wanted(item.spec, item.rows, item.method)
    fig = pareto.draw(item.rows, item.spec, item.device, item.method)
    try:
        recall, error = fig.axes
        # MiniLM's quality (random inputs' is flat, so it is not the default), against time per token in ms.
        assert recall.get_ylabel() == "mass recall (MiniLM)"
        assert error.get_ylabel() == "relative error vs exact (MiniLM) (lower is better)"
        assert recall.get_xlabel() == "time per token (ms)" and recall.get_xscale() == "log"
        for ax, quality in ((recall, "minilm_mass_recall"), (error, "minilm_attn_rel_err")):
            drawn = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
            assert set(drawn) == {"pareto:Vanilla", "pareto:topk_fast", "pareto:page_topk (page 16)"}
            for label in ("topk_fast", "page_topk (page 16)"):
                csv = rows[rows[col.LABEL] == label].sort_values("budget")
                line = drawn[f"pareto:{label}"]
                assert list(line.get_xdata()) == pytest.approx(list(csv[col.TIME_PER_TOKEN_S] * 1e3))
                assert list(line.get_ydata()) == pytest.approx(list(csv[quality]))
            # Dense attention's quality does not move with the budget: one point, its median time.
            dense = rows[rows[col.LABEL] == "Vanilla"]
            reference = drawn["pareto:Vanilla"]
            assert list(reference.get_xdata()) == pytest.approx([dense[col.TIME_PER_TOKEN_S].median() * 1e3])
            assert list(reference.get_ydata()) == pytest.approx([dense[quality].iloc[0]])
            # Each point of a method carries its budget (none overlapping here); the contended page_topk time is
            # hollow, nothing else.
            assert sorted(t.get_text() for t in ax.texts) == sorted(["2K", "4K", "8K"] * 2)
            ((x, y),) = _hollow_points(ax)
            assert x == pytest.approx(20.0)
        legend = _legend(fig)
        assert {
            pareto.REFERENCE_LEGEND,
            pareto.FRONT_LEGEND,
            marks.HOLLOW_LEGEND,
            "small numbers: token budget",
            "not shown: sink_window at 2K (timeout)",
        } <= set(legend)
    finally:
        plt.close(fig)


def test_budget_labels_that_would_overlap_are_left_out_the_ends_first():
    from topk_bench.report.plots.palette import series_style

    fig, ax = plt.subplots()
    try:
        near = pd.DataFrame(
            {
                "x": [10.0, 10.2, 10.4, 50.0],
                "y": [0.5, 0.5, 0.5, 0.9],
                "budget": [1024, 2048, 4096, 8192],
                "hollow": False,
            }
        )
        curve = pareto.Curve("m", series_style("topk", 0), near, reference=False)
        ax.plot(near["x"], near["y"])
        ax.set_xscale("log")
        pareto._label_budgets(ax, [curve])
        assert sorted(t.get_text() for t in ax.texts) == ["1K", "8K"]  # 2K and 4K sit on 1K's label
    finally:
        plt.close(fig)


def test_the_front_keeps_the_points_nothing_beats_in_time_and_quality():
    points = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0, 2.5], "y": [0.2, 0.5, 0.4, 0.9, 0.5]})
    assert list(pareto.front(points, lower_is_better=False).index) == [0, 1, 3]
    errors = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0.9, 0.95, 0.1]})
    assert list(pareto.front(errors, lower_is_better=True).index) == [0, 2]


def test_the_suites_own_figure_leaves_random_input_quality_out(selection):
    """kv_selection's default figure: time per token and MiniLM's quality in a grid; random inputs' quality
    (flat by construction) is not among its metrics, nor on the Pareto figure."""

    from topk_bench.suite.load import read_suite

    suite = read_suite(ROOT / "suites" / "kv_selection.toml")
    assert suite.plot.pareto
    assert not {"mass_recall", "topk_recall", "attn_rel_err"} & set(suite.plot.metrics)
    (item,) = figure_inputs(selection)
    assert pareto.axes_metrics(item.rows) == ("time_per_token", ("minilm_mass_recall", "minilm_attn_rel_err"))
    random_only = item.rows.drop(columns=["minilm_mass_recall", "minilm_attn_rel_err"])
    assert pareto.axes_metrics(random_only) == ("time_per_token", ("mass_recall", "attn_rel_err"))


def test_no_pareto_figure_without_a_time_or_unasked(selection, tmp_path):
    (item,) = figure_inputs(selection)
    assert not pareto.wanted(item.spec, item.rows, "predicted")
    meta = json.loads((selection / "kv.meta.json").read_text())
    meta["plot"]["pareto"] = False
    (selection / "kv.meta.json").write_text(json.dumps(meta))
    assert [p.name for p in plot_results(selection, tmp_path / "p")] == ["kv-cpu-measured.png"]
    meta["plot"]["pareto"] = "yes"
    (selection / "kv.meta.json").write_text(json.dumps(meta))
    from topk_bench.errors import BadInput

    with pytest.raises(BadInput, match="plot.pareto"):
        plot_results(selection, tmp_path / "p")


def test_plot_reads_sub_folders_into_sub_folders_of_out(tmp_path):
    """`plot results/` after `make demo` (which wrote results/demo/): the figures go to PLOTS/demo/; the
    directory's own CSVs and deeper folders' too, each folder on its own (same suite names do not collide)."""
    results = tmp_path / "results"
    (results / "demo").mkdir(parents=True)
    (results / "other" / "deep").mkdir(parents=True)
    (results / ".hidden").mkdir()
    _write(results / "mha.csv", [_mha("sdpa", "SDPA", 1024, 0.1, 0.01, QUIET)])
    _write(results / "demo" / "mha.csv", [_mha("sdpa", "SDPA", 512, 0.1, 0.01, QUIET)])
    _write(results / "other" / "deep" / "mha.csv", [_mha("vanilla", "Vanilla", 512, 0.1, 0.01, QUIET)])
    _write(results / ".hidden" / "mha.csv", [_mha("vanilla", "Vanilla", 512, 0.1, 0.01, QUIET)])
    written = plot_results(results, tmp_path / "plots")
    assert [p.relative_to(tmp_path / "plots").as_posix() for p in written] == [
        "mha-cpu-measured.png",
        "demo/mha-cpu-measured.png",
        "other/deep/mha-cpu-measured.png",
    ]
    assert np.all([p.stat().st_size > 1000 for p in written])


def test_style_has_no_fill_rule_and_spare_markers_are_not_taken():
    from topk_bench.report.plots import palette, style

    assert not hasattr(style, "HOLLOW") and not hasattr(palette, "HOLLOW")
    known = {marker for _, marker in palette.KNOWN.values()}
    assert not known & set(palette.SPARE_MARKERS) and style.FAILURE_MARKER not in palette.SPARE_MARKERS
    assert impl_style("my_plugin")[1] not in known
