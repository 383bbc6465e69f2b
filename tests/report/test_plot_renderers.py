"""`plot` runs no code a results folder names: a renderer is the user's own code, registered."""

from __future__ import annotations

import pytest

# --- plot runs no code a results folder names ----------------------------------------------------------


@pytest.mark.parametrize("renderer", ["this:x", "os:getcwd", "topk_bench.fileio:write_atomic"])
def test_plot_does_not_import_a_renderer_named_by_someone_elses_meta_json(measured_csv, cli, tmp_path, renderer):
    """ "renderer": "this:x" printed the Zen of Python: plotting someone else's results ran their choice of code."""
    import json

    meta = measured_csv.with_name("tiny.meta.json")
    data = json.loads(meta.read_text())
    data["plot"]["renderer"] = renderer
    meta.write_text(json.dumps(data))
    result = cli("plot", measured_csv.parent, "--out", tmp_path / "plots")
    line = result.error_line
    assert result.code == 2 and "plot.renderer" in line and repr(renderer) in line, line
    assert "Beautiful is better than ugly" not in result.out + result.err
    assert not (tmp_path / "plots").exists()


def test_plot_uses_a_renderer_the_users_own_code_registered_under_that_name(measured_csv, tmp_path):
    import json

    import matplotlib.pyplot as plt

    from topk_bench.report.plots.figure import RENDERERS, plot_results, register_renderer

    meta = measured_csv.with_name("tiny.meta.json")
    data = json.loads(meta.read_text())
    data["plot"]["renderer"] = "my_plots:bars"
    meta.write_text(json.dumps(data))
    calls = []
    register_renderer("my_plots:bars", lambda rows, spec, device, method: calls.append(len(rows)) or plt.figure())
    try:
        written = plot_results(measured_csv.parent, tmp_path / "plots")
    finally:
        RENDERERS.pop("my_plots:bars")
    assert calls == [3] and [p.name for p in written] == ["tiny-cpu-measured.png"]
