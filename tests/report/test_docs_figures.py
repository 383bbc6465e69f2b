"""The figures README.md and docs/ show are what `topk-bench plot` draws today from the CSVs committed beside them
(docs/figures/data/; `make figures` redraws them, `make check-figures` is this check)."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest

from locations import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import docs_figures


def _same_renderer() -> None:
    recorded = json.loads(docs_figures.RENDERER.read_text())
    if recorded != docs_figures.renderer():
        pytest.skip(f"docs/figures drawn with {recorded}, this is {docs_figures.renderer()}: glyphs differ")


def test_a_docs_figure_is_what_plot_draws_today_and_a_changed_one_is_named(tmp_path):
    """Fast: one figure (the smallest suite) redrawn and compared; the check fails on a stale or missing one."""
    _same_renderer()
    data = tmp_path / "data"
    data.mkdir()
    for name in ("chunk_size.csv", "chunk_size.meta.json"):
        shutil.copy2(docs_figures.DATA / name, data / name)
    drawn = {p.name: p for p in docs_figures.draw(tmp_path / "drawn", data)}
    assert list(drawn) == ["chunk_size-cpu-predicted.png"]
    committed = tmp_path / "committed"
    committed.mkdir()
    shutil.copy2(docs_figures.FIGURES / "chunk_size-cpu-predicted.png", committed)
    assert docs_figures.differences(committed, drawn) == []
    # The check can fail: a figure drawn before a change (here: 100 of its pixels changed), one not committed,
    # one that no CSV draws.
    from matplotlib.image import imread, imsave

    pixels = imread(committed / "chunk_size-cpu-predicted.png")
    pixels[100:110, 100:110, :3] = 1 - pixels[100:110, 100:110, :3]
    imsave(committed / "chunk_size-cpu-predicted.png", pixels)
    shutil.copy2(docs_figures.FIGURES / "ff-cpu-predicted.png", committed)
    problems = docs_figures.differences(committed, drawn)
    assert [p.split(":")[0] for p in problems] == ["chunk_size-cpu-predicted.png", "ff-cpu-predicted.png"]
    assert "pixels differ" in problems[0] and "no CSV" in problems[1]
    (committed / "chunk_size-cpu-predicted.png").unlink()
    assert "not committed" in docs_figures.differences(committed, drawn)[0]


@pytest.mark.slow
def test_every_docs_figure_is_what_plot_draws_today_from_its_committed_csv(tmp_path):
    """Slow (12 figures, about 30 s on 2 busy cores): what `make check-figures` checks."""
    _same_renderer()
    drawn = {p.name: p for p in docs_figures.draw(tmp_path / "drawn")}
    assert len(drawn) == len(list(docs_figures.FIGURES.glob("*.png"))) >= 12
    assert docs_figures.differences(docs_figures.FIGURES, drawn) == []


def test_every_figure_the_docs_link_to_is_committed_with_its_csv():
    linked = set()
    for doc in (ROOT / "README.md", *(ROOT / "docs").glob("*.md")):
        linked |= set(re.findall(r"figures/([\w.-]+\.png)", doc.read_text()))
    assert "mha-cpu-predicted.png" in linked and "kv_selection-pareto-cpu-measured.png" in linked
    for name in linked:
        assert (docs_figures.FIGURES / name).exists(), name
        # <suite>[-<split values>][-pareto|-stages]-<device>-<method>.png; suite names have no "-".
        suite = name.split("-")[0]
        assert (docs_figures.DATA / f"{suite}.csv").exists() and (docs_figures.DATA / f"{suite}.meta.json").exists()
