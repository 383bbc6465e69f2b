"""A CUDA prediction's time where a user meets it: ``show``'s cells (and the peak beside ``over_budget``),
``compare`` of a predicted run against a measured one, the figure's time panels."""

from __future__ import annotations

import pandas as pd
import pytest

from locations import ROOT
from topk_bench.report import predicted_vs_measured as pvm
from topk_bench.report.show import exceeded_peak, pivot_cell
from topk_bench.results import columns as col

GIB = 2**30


def row(**cells):
    base = {
        col.STATUS: "ok",
        col.TIME_MEDIAN_S: None,
        col.PEAK_BYTES: None,
        col.TRUST: "",
        col.RESERVED_BYTES: None,
        col.MAX_MEMORY_BYTES: None,
        col.TIME_PREDICTED_S: None,
    }
    return {**base, **cells}


def test_over_budget_shows_the_peak_that_passed_the_budget():
    over = row(status="over_budget", peak_bytes=3 * GIB, reserved_bytes=5 * GIB, max_memory_bytes=4 * GIB)
    assert exceeded_peak(over) == 5 * GIB
    assert pivot_cell(over) == "over_budget\n5.00GiB"
    # the allocated peak alone passed (reserved under the budget): that one is shown
    assert pivot_cell(
        row(status="over_budget", peak_bytes=4.5 * GIB, reserved_bytes=None, max_memory_bytes=4 * GIB)
    ) == ("over_budget\n4.50GiB")
    assert pivot_cell(row(status="over_budget")) == "over_budget"  # no peak in the row: the status alone
    assert pivot_cell(row(status="timeout", peak_bytes=GIB)) == "timeout"


def test_a_predicted_time_is_marked_a_measured_one_is_not():
    assert pivot_cell(row(time_predicted_s=0.0123, peak_bytes=GIB)) == "~12.3ms\n1.00GiB"
    assert pivot_cell(row(time_median_s=0.0123, peak_bytes=GIB)) == "12.3ms\n1.00GiB"


def _frame(method: str, **columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    return pd.DataFrame(
        {
            col.WORKLOAD: ["mha"] * n,
            col.IMPL: ["vanilla"] * n,
            col.LABEL: [""] * n,
            col.MODE: ["fwd_bwd"] * n,
            col.METHOD: [method] * n,
            col.STATUS: ["ok"] * n,
            "dtype": ["float32"] * n,
            **columns,
        }
    )


def test_compare_of_a_prediction_and_a_measurement_pairs_cases_and_says_how_far_apart():
    predicted = _frame(
        "predicted",
        seq_len=[512, 1024, 2048],
        time_predicted_s=[0.002, 0.004, 0.010],
        device_time_predicted_s=[0.001, 0.003, 0.009],
        peak_bytes=[100, 200, 400],
    )
    measured = _frame(
        "measured",
        seq_len=[1024, 512, 4096],
        time_median_s=[0.003, 0.001, 0.5],
        timer=["cudagraph", "events", "events"],
        peak_bytes=[200, 100, 800],
    )
    assert pvm.applies(predicted, measured) and pvm.applies(measured, predicted)
    assert not pvm.applies(measured, measured)
    found = pvm.pairs(measured, predicted)  # either order
    by_name = {p.name: p for p in found}
    assert set(by_name) == {"mha/vanilla seq_len=1024", "mha/vanilla seq_len=512"}  # 2048 and 4096 unpaired
    # a row timed as a graph replay is compared with the device time, an eager one with the eager time
    assert by_name["mha/vanilla seq_len=1024"].time_ratio == pytest.approx(1.0)
    assert by_name["mha/vanilla seq_len=512"].time_ratio == pytest.approx(2.0)
    assert by_name["mha/vanilla seq_len=512"].peak_ratio == pytest.approx(1.0)
    text = "\n".join(pvm.lines(found))
    assert "median |predicted / measured - 1| = 50.0% over 2 case(s), 2 within 2x" in text


def test_compare_cli_of_a_prediction_against_a_measurement_exits_0(tmp_path, cli):
    measured = ROOT / "tests" / "data" / "h100-2026-11-26" / "mha.csv"
    frame = pd.read_csv(measured)
    frame = frame[frame["status"] == "ok"].assign(
        method="predicted", time_predicted_s=frame["time_median_s"] * 1.5, time_median_s=None, times_s=None
    )
    frame["case_id"] = frame["case_id"].str[::-1]  # a prediction's ids are its own
    predicted = tmp_path / "predicted.csv"
    frame.to_csv(predicted, index=False)
    result = cli("compare", predicted, measured)
    assert result.code == 0, result
    assert f"median |predicted / measured - 1| = 50.0% over {len(frame)} case(s)" in result.out


TINY = """
name = "tiny"
workload = "mha"
causal = true
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16, 32]
[[impl]]
name = "vanilla"
[[impl]]
name = "sdpa"
"""


@pytest.mark.slow  # the real run: a child process per case
def test_a_cuda_predictions_figure_draws_its_predicted_time(tmp_path, capsys):
    """The real run (--predict --device cuda, a few seconds), then its figure: memory above, predicted time below,
    the part named in the title."""
    import matplotlib.pyplot as plt

    from topk_bench.cli import main
    from topk_bench.report.plots.figure import draw_figure
    from topk_bench.report.plots.inputs import figure_inputs

    (tmp_path / "tiny.toml").write_text(TINY)
    with pytest.raises(SystemExit) as exit_:
        main(
            ["run", str(tmp_path / "tiny.toml"), "--out", str(tmp_path / "out"), "--predict", "--device", "cuda", "-q"]
        )
    assert exit_.value.code == 0, capsys.readouterr().err
    (item,) = figure_inputs(tmp_path / "out")
    fig = draw_figure(item.rows, item.spec, item.device, item.method)
    try:
        labels = [ax.get_ylabel() for ax in fig.axes]
        assert "predicted time (s)" in labels
        times = [ax for ax in fig.axes if ax.get_ylabel() == "predicted time (s)"][0]
        drawn = sorted(y for line in times.get_lines() for y in line.get_ydata())
        assert drawn == sorted(pd.to_numeric(item.rows[col.TIME_PREDICTED_S]))
        assert "predicted for NVIDIA H100 80GB HBM3" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
