"""`topk-bench plot`: figures per suite, device and method; every status drawn or reported; bad inputs exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from topk_bench.case import STATUSES
from topk_bench.errors import BadInput
from topk_bench.plot_spec import infer_spec
from topk_bench.plot_style import impl_style
from topk_bench.plots import parse_formats, plot_results, register_renderer, RENDERERS
from topk_bench.results import REQUIRED_COLUMNS

GIB = 2**30
IMPLS = {"vanilla": "vanilla", "qchunk": "query chunking", "topk": "top-128", "performer": "performer"}


def _row(suite, impl, method, status, seq_len, peak_gib=None, seconds=None, device="cpu", **params):
    row = dict.fromkeys(REQUIRED_COLUMNS, "")
    row.update(suite=suite, case_id=f"{impl}-{seq_len}-{method}", workload="mha", impl=impl, label=IMPLS[impl],
               mode="fwd_bwd", device=device, device_name="test cpu", method=method, status=status,
               peak_bytes=None if peak_gib is None else int(peak_gib * GIB),
               time_median_s=seconds, repeats=3, seq_len=seq_len, **params)
    return row


def _mha_rows(method):
    """Vanilla stops by OOM, qchunk by a time-out, performer is unsupported, topk crashes once then errors."""
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
        _row("mha", "topk", method, "crashed", 8192),
        _row("mha", "topk", method, "error", 16384),
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
    assert {r["status"] for r in rows} == set(STATUSES)
    pd.DataFrame(rows).to_csv(out / "mha.csv", index=False)
    (out / "mha.meta.json").write_text(json.dumps({
        "suite": "mha", "title": "MHA layer", "workload": "mha",
        "plot": {"x": "seq_len", "x_label": "sequence length", "log_x": 2, "log_y": False,
                 "panels": [[512, 2048], [2048, 16384]], "metrics": ["memory", "time"]}}))
    ff = [dict(_row("ff", "topk", "predicted", "ok", 512, 0.5 * k / 256, None, d_ff=d, topk=k), workload="ff")
          for d in (2048, 4096, 8192) for k in (256, 512)]
    pd.DataFrame(ff).to_csv(out / "ff.csv", index=False)
    return out


def test_one_file_per_suite_device_method_and_format(results, tmp_path):
    written = plot_results(results, tmp_path / "plots", ("png", "pdf"))
    names = sorted(p.name for p in written)
    expected = sorted(f"{stem}.{fmt}" for stem in ("mha-cpu-measured", "mha-cpu-predicted", "mha-cuda-measured",
                                                   "ff-cpu-predicted") for fmt in ("png", "pdf"))
    assert names == expected
    assert all(p.stat().st_size > 1000 for p in written)


def test_cli_plots_and_lists_the_files(results, tmp_path):
    out = tmp_path / "figs"
    result = subprocess.run([sys.executable, "-m", "topk_bench", "plot", str(results), "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (out / "mha-cpu-predicted.png").exists()
    assert len(result.stdout.split()) == 4


def _cli_error(*args):
    result = subprocess.run([sys.executable, "-m", "topk_bench", "plot", *map(str, args)],
                            capture_output=True, text=True)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_bad_directories_exit_2_with_one_line(tmp_path):
    assert "no such results directory" in _cli_error(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no results CSV" in _cli_error(empty)
    bad = tmp_path / "bad"
    bad.mkdir()
    pd.DataFrame({"suite": ["x"], "seq_len": [1]}).to_csv(bad / "x.csv", index=False)
    line = _cli_error(bad)
    assert "x.csv" in line and "missing required columns" in line


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

    from topk_bench.plot_inputs import figure_inputs
    from topk_bench.plots import draw_figure

    figures = {(i.spec.suite, i.device, i.method): i for i in figure_inputs(results)}
    measured = draw_figure(*_args(figures[("mha", "cpu", "measured")]))
    predicted = draw_figure(*_args(figures[("mha", "cpu", "predicted")]))
    try:
        assert len(measured.axes) == 4  # 2x2 like Fig. 1: memory over time, short and long lengths
        assert len(predicted.axes) == 2  # no time measured: memory row only
        assert "predicted" in predicted._suptitle.get_text()
        lines = [line for line in predicted.axes[0].get_lines() if line.get_label() == "vanilla"]
        assert lines and lines[0].get_linestyle() != "-"  # predicted curves are dashed
    finally:
        plt.close(measured)
        plt.close(predicted)


def _args(item):
    return item.rows, item.spec, item.device, item.method
