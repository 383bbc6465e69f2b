"""`topk-bench plot`: figures per suite, device and method; every status drawn or reported; bad inputs exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from locations import ROOT
from topk_bench.case import Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.report.plots.figure import RENDERERS, parse_formats, plot_results, register_renderer
from topk_bench.report.plots.palette import impl_style
from topk_bench.report.plots.spec import infer_spec
from topk_bench.results.columns import header as results_header
from topk_bench.results.columns import order_parameters
from topk_bench.results.row import make_row, parameters
from topk_bench.results.store import append_row
from topk_bench.status import STATUSES

GIB = 2**30
IMPLS = {"vanilla": "vanilla", "qchunk": "query chunking", "topk": "top-128", "performer": "performer"}


def _row(suite, impl, method, status, seq_len, peak_gib=None, seconds=None, device="cpu", workload="mha", **params):
    """(case, measurement) of one point; written below with the real writer, as a run writes them."""
    options = {k: v for k, v in params.items() if k == "topk"}
    case = Case.make(
        suite=suite,
        workload=workload,
        impl=impl,
        label=IMPLS[impl],
        device=device,
        method=method,
        params={"seq_len": seq_len, **{k: v for k, v in params.items() if k != "topk"}},
        options=options,
    )
    measurement = Measurement(
        status=status,
        device_name="test cpu",
        peak_bytes=None if peak_gib is None else int(peak_gib * GIB),
        times_s=[] if seconds is None else [seconds] * 3,
    )
    return case, measurement


def _write(path, points):
    """The CSV a run would write: one ``append_row`` per case, with the run's header."""
    header = results_header(order_parameters(k for case, _ in points for k in parameters(case)))
    for case, measurement in points:
        header = append_row(path, make_row(case, measurement), header)


def _mha_rows(method):
    """Vanilla stops by OOM, qchunk by a time-out, performer is unsupported then NaN, topk crashes once then errors;
    three Slurm jobs ended before their cases (cancelled, preempted, lost)."""
    timed = method == "measured"
    t = (lambda s: s) if timed else (lambda s: None)
    rows = []
    for i, L in enumerate([512, 1024, 2048, 4096]):
        rows.append(_row("mha", "topk", method, "ok", L, 0.1 * (i + 1), t(0.01 * (i + 1))))
    rows += [
        _row("mha", "vanilla", method, "ok", 512, 0.2, t(0.01)),
        _row("mha", "vanilla", method, "ok", 1024, 0.8, t(0.03)),
        _row("mha", "vanilla", method, "oom", 2048),
        _row("mha", "vanilla", method, "skipped", 4096),
        _row("mha", "qchunk", method, "ok", 512, 0.15, t(0.02)),
        _row("mha", "qchunk", method, "over_budget", 1024, 40.0),
        _row("mha", "qchunk", method, "timeout", 2048),
        _row("mha", "performer", method, "unsupported", 512),
        _row("mha", "performer", method, "nonfinite", 1024, 0.3, t(0.02)),
        _row("mha", "topk", method, "crashed", 8192),
        _row("mha", "topk", method, "error", 16384),
        _row("mha", "topk", method, "not_as_asked", 32768, 0.5, t(0.03)),
        # What happened to a Slurm job, not to the case: nothing to draw (a resume runs them again).
        _row("mha", "qchunk", method, "cancelled", 4096),
        _row("mha", "performer", method, "preempted", 2048),
        _row("mha", "performer", method, "lost", 4096),
    ]
    return rows


@pytest.fixture
def results(tmp_path):
    """A results dir: mha.csv with every status, both methods and two devices (one meta.json with 2 panels);
    ff.csv without meta.json (x inferred: d_ff), with two top-k variants."""
    out = tmp_path / "results"
    out.mkdir()
    rows = _mha_rows("measured") + _mha_rows("predicted")
    rows.append(_row("mha", "topk", "measured", "ok", 512, 0.1, 0.002, device="cuda"))
    assert {m.status for _, m in rows} == set(STATUSES)
    _write(out / "mha.csv", rows)
    (out / "mha.meta.json").write_text(
        json.dumps(
            {
                "suite": "mha",
                "title": "MHA layer",
                "workload": "mha",
                "plot": {
                    "x": "seq_len",
                    "x_label": "sequence length",
                    "log_x": 2,
                    "log_y": False,
                    "panels": [[512, 2048], [2048, 16384]],
                    "metrics": ["memory", "time"],
                },
            }
        )
    )
    ff = [
        _row("ff", "topk", "predicted", "ok", 512, 0.5 * k / 256, None, workload="ff", d_ff=d, topk=k)
        for d in (2048, 4096, 8192)
        for k in (256, 512)
    ]
    _write(out / "ff.csv", ff)
    return out


def test_one_file_per_suite_device_method_and_format(results, tmp_path):
    written = plot_results(results, tmp_path / "plots", ("png", "pdf"))
    names = sorted(p.name for p in written)
    expected = sorted(
        f"{stem}.{fmt}"
        for stem in ("mha-cpu-measured", "mha-cpu-predicted", "mha-cuda-measured", "ff-cpu-predicted")
        for fmt in ("png", "pdf")
    )
    assert names == expected
    assert all(p.stat().st_size > 1000 for p in written)


@pytest.mark.slow
def test_cli_plots_and_lists_the_files(results, tmp_path):
    out = tmp_path / "figs"
    result = subprocess.run(
        [sys.executable, "-m", "topk_bench", "plot", str(results), "--out", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (out / "mha-cpu-predicted.png").exists()
    assert len(result.stdout.split()) == 4


def _cli_error(*args):
    result = subprocess.run(
        [sys.executable, "-m", "topk_bench", "plot", *map(str, args)], capture_output=True, text=True
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.slow
def test_bad_directories_exit_2_with_one_line(tmp_path):
    assert "no such file or directory" in _cli_error(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no results CSV" in _cli_error(empty)
    bad = tmp_path / "bad"
    bad.mkdir()
    pd.DataFrame({"suite": ["x"], "seq_len": [1]}).to_csv(bad / "x.csv", index=False)
    line = _cli_error(bad)
    assert "x.csv" in line and "not a topk-bench results file: no column" in line


def test_bad_meta_and_format_are_bad_input(results, tmp_path):
    with pytest.raises(BadInput, match="--format"):
        parse_formats("png,gif")
    (results / "mha.meta.json").write_text('{"plot": {"x": "no_such_column"}}')
    with pytest.raises(BadInput, match="plot.x"):
        plot_results(results, tmp_path / "o")


def test_inferred_x_is_the_swept_parameter(results):
    frame = pd.read_csv(results / "ff.csv")
    spec = infer_spec(frame, results / "ff.csv")
    assert spec.x == "d_ff" and spec.log_x == 2


def test_colour_and_marker_fixed_per_implementation():
    assert impl_style("topk") == impl_style("topk")
    assert impl_style("topk") != impl_style("vanilla")
    assert impl_style("my_plugin") == impl_style("my_plugin")


def test_parse_formats():
    assert parse_formats("png, PDF") == ("png", "pdf")


def test_plug_in_renderer_takes_over_its_suite(results, tmp_path):
    import matplotlib.pyplot as plt

    calls = []

    def fidelity(rows, spec, device, method):
        calls.append((spec.suite, device, method, len(rows)))
        return plt.figure()

    register_renderer("ff", fidelity)
    try:
        plot_results(results, tmp_path / "plots")
    finally:
        RENDERERS.pop("ff")
    assert calls == [("ff", "cpu", "predicted", 6)]


def test_layout_follows_panels_and_drops_the_time_row_of_predictions(results):
    import matplotlib.pyplot as plt

    from topk_bench.report.plots.figure import draw_figure
    from topk_bench.report.plots.inputs import figure_inputs

    figures = {(i.spec.suite, i.device, i.method): i for i in figure_inputs(results)}
    measured = draw_figure(*_args(figures[("mha", "cpu", "measured")]))
    predicted = draw_figure(*_args(figures[("mha", "cpu", "predicted")]))
    try:
        assert len(measured.axes) == 4  # 2x2 like Fig. 1: memory over time, short and long lengths
        assert len(predicted.axes) == 2  # no time measured: memory row only
        assert "predicted" in predicted._suptitle.get_text()
        lines = [line for line in predicted.axes[0].get_lines() if line.get_label() == "vanilla"]
        # Dashes say which variant of an implementation, nothing else: the title says it is predicted.
        assert lines and lines[0].get_linestyle() == "-"
    finally:
        plt.close(measured)
        plt.close(predicted)


def _args(item):
    return item.rows, item.spec, item.device, item.method


def test_failures_sit_on_the_top_edge_each_labelled_and_times_carry_their_iqr(tmp_path):
    """A case that stopped is drawn above the curves (on the panel's top edge), never at the height of
    the last good point, and every cross has its status written; measured times get IQR bars."""
    import matplotlib.pyplot as plt

    from topk_bench.report.plots.figure import draw_figure
    from topk_bench.report.plots.inputs import figure_inputs

    out = tmp_path / "r"
    out.mkdir()
    points = [
        _row("mha", "vanilla", "measured", "ok", 512, 0.5, 0.01),
        _row("mha", "vanilla", "measured", "timeout", 1024),
        _row("mha", "qchunk", "measured", "over_budget", 1024, 36.5),
        _row("mha", "qchunk", "measured", "ok", 512, 0.2, 0.02),
    ]
    for _case, measurement in points:
        if measurement.times_s:
            measurement.times_s = [0.8 * measurement.times_s[0], measurement.times_s[0], 1.5 * measurement.times_s[0]]
    _write(out / "mha.csv", points)
    (item,) = figure_inputs(out)
    fig = draw_figure(*_args(item))
    try:
        memory, time = fig.axes[0], fig.axes[1]
        for ax in (memory, time):
            crosses = [line for line in ax.get_lines() if line.get_marker() == "X"]
            assert len(crosses) == 2
            # In axes coordinates (x in data, y a fraction of the panel): the top edge, whatever the data.
            assert all(
                line.get_transform() == ax.get_xaxis_transform() and line.get_ydata()[0] > 0.9 for line in crosses
            )
            texts = [t.get_text() for t in ax.texts]
            assert "timeout" in texts and any(t.startswith("over budget") for t in texts)
        assert "over budget (36.5 GiB)" in [t.get_text() for t in memory.texts]
        assert time.collections, "no IQR error bars on measured times"
        labels = [t.get_text().replace("\n", " ") for t in fig.legends[0].get_texts()]
        assert "stopped: beyond the frame, on its top edge (reason written)" in labels
    finally:
        plt.close(fig)


def _cuda_and_cpu_results(out, memory):
    """mha.csv measured on cuda (allocated and reserved peaks) and on cpu (allocated only), [plot] memory."""
    out.mkdir()
    points = []
    for device in ("cuda", "cpu"):
        for i, L in enumerate([512, 1024]):
            case, m = _row("mha", "vanilla", "measured", "ok", L, 0.5 * (i + 1), 0.01, device=device)
            m.reserved_bytes = m.peak_bytes * 2 if device == "cuda" else None
            points.append((case, m))
    _write(out / "mha.csv", points)
    (out / "mha.meta.json").write_text(
        json.dumps(
            {
                "suite": "mha",
                "title": "MHA",
                "workload": "mha",
                "plot": {"x": "seq_len", "metrics": ["memory", "time"], "memory": memory},
            }
        )
    )
    return out


@pytest.mark.parametrize("memory", ["allocated", "reserved"])
def test_memory_row_draws_the_chosen_peak_where_the_rows_have_it(tmp_path, memory):
    import matplotlib.pyplot as plt

    from topk_bench.report.plots.figure import draw_figure
    from topk_bench.report.plots.inputs import figure_inputs

    figures = {i.device: i for i in figure_inputs(_cuda_and_cpu_results(tmp_path / "r", memory))}
    cuda, cpu = draw_figure(*_args(figures["cuda"])), draw_figure(*_args(figures["cpu"]))
    try:
        drawn = list(cuda.axes[0].get_lines()[0].get_ydata())
        if memory == "reserved":
            assert cuda.axes[0].get_ylabel() == "peak reserved memory (GiB)" and drawn == [1.0, 2.0]
        else:
            assert cuda.axes[0].get_ylabel() == "peak allocated memory (GiB)" and drawn == [0.5, 1.0]
        # The CPU has no reserved peak: its figure draws the allocated one, and says so.
        assert cpu.axes[0].get_ylabel() == "peak allocated memory (GiB)"
        assert list(cpu.axes[0].get_lines()[0].get_ydata()) == [0.5, 1.0]
    finally:
        plt.close(cuda)
        plt.close(cpu)


def test_plot_memory_flag_overrides_the_suite_and_warns_where_it_cannot(tmp_path):
    from topk_bench.report.plots.inputs import figure_inputs
    from topk_bench.report.plots.spec import memory_metric

    results = _cuda_and_cpu_results(tmp_path / "r", "allocated")
    warnings = []
    written = plot_results(results, tmp_path / "p", warn=warnings.append, memory="reserved")
    assert sorted(p.name for p in written) == ["mha-cpu-measured.png", "mha-cuda-measured.png"]
    assert len(warnings) == 1 and warnings[0].startswith("mha-cpu-measured: not every measured point")
    assert {i.device: memory_metric(i.spec, i.rows) for i in figure_inputs(results)} == {
        "cuda": "memory",
        "cpu": "memory",
    }
    with pytest.raises(BadInput, match="--memory"):
        plot_results(results, tmp_path / "p", memory="free")
    (results / "mha.meta.json").write_text(json.dumps({"plot": {"memory": "peak"}}))
    with pytest.raises(BadInput, match="plot.memory"):
        plot_results(results, tmp_path / "p")


def test_paper_reproduction_suites_plot_reserved_on_cuda():

    from topk_bench.suite.load import read_suite

    root = ROOT / "suites"
    for name in ("mha", "ff", "decoder", *(f"paper/{p.stem}" for p in sorted((root / "paper").glob("*.toml")))):
        assert read_suite(root / f"{name}.toml").plot.memory == "reserved", name


def test_one_figure_per_model_with_time_per_token_and_the_memory_above_inputs(tmp_path):
    """A suite of several models (``split = ["model"]``): a figure each, named after it; the metrics of the
    inference workloads (time per token; the peak above the inputs, i.e. without the KV cache)."""
    import matplotlib.pyplot as plt

    from topk_bench.report.plots.figure import draw_figure
    from topk_bench.report.plots.inputs import figure_inputs
    from topk_bench.workloads import traffic

    out = tmp_path / "r"
    out.mkdir()
    points = []
    for model, heads in (("llama-3-8b", (32, 8, 128)), ("bert-base", (12, 12, 64))):
        for kv_len in (1024, 2048):
            for batch in (1, 8):
                case = Case.make(
                    suite="decode",
                    workload="decode",
                    impl="sdpa",
                    label="SDPA",
                    method="measured",
                    dtype="bfloat16",
                    mode="fwd",
                    causal=True,
                    params=dict(
                        model=model,
                        kv_len=kv_len,
                        batch=batch,
                        new_tokens=2,
                        q_heads=heads[0],
                        kv_heads=heads[1],
                        head_dim=heads[2],
                    ),
                )
                cache = traffic(case).kv_cache_bytes
                points.append(
                    (
                        case,
                        Measurement(
                            status="ok",
                            device_name="test cpu",
                            baseline_bytes=cache,
                            peak_bytes=cache + 2**20 * batch,
                            times_s=[0.01, 0.02, 0.03],
                        ),
                    )
                )
    header = results_header(order_parameters(k for case, _ in points for k in parameters(case)))
    for case, measurement in points:
        header = append_row(out / "decode.csv", make_row(case, measurement, traffic=traffic(case)), header)
    (out / "decode.meta.json").write_text(
        json.dumps(
            {
                "suite": "decode",
                "title": "Decode",
                "workload": "decode",
                "plot": {
                    "x": "kv_len",
                    "log_x": 2,
                    "split": ["model"],
                    "metrics": ["time_per_token", "working_memory"],
                },
            }
        )
    )
    written = plot_results(out, tmp_path / "plots")
    assert sorted(p.name for p in written) == [
        "decode-bert-base-cpu-measured.png",
        "decode-llama-3-8b-cpu-measured.png",
    ]
    items = {i.split: i for i in figure_inputs(out)}
    fig = draw_figure(*_args(items[("llama-3-8b",)]))
    try:
        assert "model llama-3-8b" in fig._suptitle.get_text()
        time, memory = fig.axes
        # MiB: the unit that fits 1 to 8 MiB above the inputs
        assert time.get_ylabel() == "time per token (ms)" and memory.get_ylabel() == "peak above inputs (MiB)"
        # one curve per batch size (the model is the figure's), at 20 ms / 2 new tokens, and 1 or 8 MiB
        lines = {line.get_label(): line for line in time.get_lines() if line.get_label().startswith("SDPA")}
        assert sorted(lines) == ["SDPA (batch=1)", "SDPA (batch=8)"]
        assert list(lines["SDPA (batch=1)"].get_ydata()) == pytest.approx([10.0, 10.0])
        above = {line.get_label(): list(line.get_ydata()) for line in memory.get_lines()}
        assert above["SDPA (batch=8)"] == pytest.approx([8, 8])
    finally:
        plt.close(fig)


def test_an_option_that_moves_with_x_is_one_curve_and_one_that_does_not_splits_it():
    from topk_bench.report.plots.series import series as _series
    from topk_bench.report.plots.spec import PlotSpec

    # A swept token budget sets page_topk's token_budget (one value per x); batch has two values per x.
    rows = pd.DataFrame(
        {
            "label": "page_topk",
            "impl": "page_topk",
            "budget": [2, 4, 2, 4],
            "token_budget": [2, 4, 2, 4],
            "batch": [1, 1, 8, 8],
        }
    )
    spec = PlotSpec(
        suite="s", title="t", workload="decode", x="budget", x_label="b", parameters=("budget", "token_budget", "batch")
    )
    assert sorted(legend for legend, _, _ in _series(rows, spec)) == ["page_topk (batch=1)", "page_topk (batch=8)"]


@pytest.mark.parametrize(
    ("sizes", "plot", "log_x"),
    [
        ((1024, 2048, 4096), "", 2),  # geometric: on a linear axis "1K2K4K" print over one another
        ((1000, 4000, 16000), "", 2),
        ((1024, 2048, 3072), "", 0),  # a step, not a factor: linear
        ((1024, 2048, 4096), "[plot]\nlog_x = 0\n", 0),  # what the suite says wins
        ((1024, 2048, 4096), "[plot]\nlog_x = 10\n", 10),
    ],
)
def test_a_geometric_sweep_is_drawn_on_a_log_axis_unless_the_suite_says_otherwise(tmp_path, sizes, plot, log_x):
    from topk_bench.report.plots.inputs import figure_inputs
    from topk_bench.run import runner
    from topk_bench.run.resolve import Flags

    suite = tmp_path / "geo.toml"
    suite.write_text(
        f'name = "geo"\nworkload = "mha"\ncausal = true\n[shape]\nd_model = 8\nheads = 2\n[sweep]\n'
        f'seq_len = {list(sizes)}\n[[impl]]\nname = "vanilla"\n{plot}'
    )
    runner.run(suite, Flags(out=tmp_path / "out", predict=True), progress=False)
    written = json.loads((tmp_path / "out" / "geo.meta.json").read_text())["plot"]["log_x"]
    assert written == (log_x if plot else None)  # not given: null, the sweep decides
    assert {i.spec.log_x for i in figure_inputs(tmp_path / "out")} == {log_x}
