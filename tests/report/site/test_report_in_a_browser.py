"""The report's page in a real browser (headless Chromium, Debian's, through its chromedriver): each suite's
table, the figures (loaded), the crossover sentence, a history chart whose points link to their commits, a
screenshot that is not blank, a case named ``<script>`` shown as text and run as nothing, and a page of 100,000
rows that opens in under 5 s. Skipped, with the reason, where Chromium is missing (.ci/chromium.sh)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import report_browser
import report_data as data
from report_data import HOSTILE, SHA, URL, crossing_rows, history_folder, report

pytestmark = pytest.mark.skipif(report_browser.skip_reason() is not None, reason=str(report_browser.skip_reason()))

# What the page's script-free DOM is asked, in one call.
_DOM = """
const text = e => e.textContent.replace(/\\s+/g, ' ').trim();
const suites = Array.from(document.querySelectorAll('section.suite')).map(s => ({
  suite: s.dataset.suite, tables: s.querySelectorAll('table.pivot').length,
  figures: s.querySelectorAll('figure img').length}));
return {
  suites: suites,
  sentences: Array.from(document.querySelectorAll('section.part li.crossover')).map(text),
  summary: Array.from(document.querySelectorAll('table.crossovers td')).map(text),
  history: Array.from(document.querySelectorAll('figure.history img')).map(i => i.useMap),
  areas: Array.from(document.querySelectorAll('figure.history map area')).map(a => a.href),
  steps: Array.from(document.querySelectorAll('li.step')).map(text),
  scripts: document.scripts.length,
  body: document.body.innerText,
  pwned: window.pwned === undefined ? null : window.pwned,
};
"""

# Every image loaded: the lazy ones brought into view first.
_LOADED = """
const images = Array.from(document.images);
images.forEach(i => { i.loading = 'eager'; });
return images.map(i => i.complete && i.naturalWidth > 0);
"""


def _site(tmp_path: Path, capsys) -> Path:
    data.write(tmp_path / "measured", crossing_rows(suite="mha"), suite="mha")
    data.write(tmp_path / "predicted", crossing_rows(suite="sd", method="predicted", device="cuda"), suite="sd")
    data.write(tmp_path / "evil", crossing_rows(suite="evil", label=HOSTILE), suite="evil")
    (tmp_path / "evil" / "evil.meta.json").write_text(json.dumps({"suite": "evil", "title": HOSTILE}))
    history = history_folder(tmp_path / "history")
    code, _, err = report(
        *(str(tmp_path / d) for d in ("measured", "predicted", "evil")),
        "--history",
        str(history),
        "--relative-to",
        "sdpa",
        "--commit-url",
        URL,
        "--out",
        str(tmp_path / "site"),
        capsys=capsys,
    )
    assert code == 0, err
    return tmp_path / "site" / "index.html"


def _not_blank(png: Path) -> None:
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))[..., :3]
    inked = (pixels.min(axis=2) < 0.9).mean()  # share of pixels that are not (nearly) white
    colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert pixels.shape[0] > 500 and inked > 0.02 and colours > 50, (pixels.shape, inked, colours)


def _on_the_points(png: Path, centres: list[str]) -> None:
    """Each area of the chart's image map is centred on a point of it (the markers' blue within 3 pixels)."""
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))[..., :3]
    marker = np.array([0x1F, 0x5F, 0xA8]) / 255  # topk_bench/report/site/history_figure.py's points
    assert len(centres) == 2 * len(SHA)  # a point per commit in time and in peak
    for coords in centres:
        x, y, _ = map(int, coords.split(","))
        patch = pixels[max(0, y - 3) : y + 4, max(0, x - 3) : x + 4]
        assert np.abs(patch - marker).sum(axis=2).min() < 0.05, coords


def test_the_page_in_chromium(tmp_path, capsys):
    page = _site(tmp_path, capsys)
    with report_browser.chromium() as browser:
        started = time.perf_counter()
        browser.get(page.as_uri())
        dom = browser.execute_script(_DOM)
        for _ in range(50):  # the lazy images, asked to load now
            loaded = browser.execute_script(_LOADED)
            if all(loaded):
                break
            time.sleep(0.2)
        opened = time.perf_counter() - started
        # a top-k case's chart (SDPA's, the reference of --relative-to, has no time points)
        charts = browser.find_elements("css selector", "figure.history")
        chart = next(c for c in charts if "Top-k" in c.text)
        chart.find_element("css selector", "img").screenshot(str(tmp_path / "chart.png"))
        centres = [a.get_attribute("coords") for a in chart.find_elements("css selector", "area")]
        report_browser.screenshot(browser, page, tmp_path / "page.png")
    by_suite = {s["suite"]: s for s in dom["suites"]}
    assert set(by_suite) == {"mha", "sd", "evil"}
    assert all(s["tables"] == 1 for s in dom["suites"])
    svgs = {p.parent.name for p in (tmp_path / "site" / "figures").rglob("*.svg")}
    assert len(svgs) == 3 and all(s["figures"] >= 1 for s in dom["suites"])
    assert loaded and all(loaded), loaded  # every figure and history chart shown, none broken
    assert (
        "time Top-k is faster than PyTorch SDPA from seq_len ≈ 4000 on (interpolated in log-log between 2048 and "
        "4096; 95% bootstrap interval"
    ) in " ".join(dom["sentences"])
    assert "memory Top-k has a smaller peak than PyTorch SDPA from seq_len ≈ 3000 on" in " ".join(dom["sentences"])
    assert "from ≈ 4000 (95%:" in " ".join(dom["summary"])
    # the history: a chart per case, each point a link to its commit
    assert len(dom["history"]) == 4 and all(m.startswith("#map-") for m in dom["history"])
    assert set(dom["areas"]) == {URL.replace("{sha}", sha) for sha in SHA}
    assert len(dom["steps"]) == 2 and all("time ×1.30 at" in s for s in dom["steps"])
    # the stranger's case: its text shown as it is, nothing of it run
    assert dom["scripts"] == 0 and dom["pwned"] is None
    assert "<script>window.pwned=1</script>" in dom["body"]
    _on_the_points(tmp_path / "chart.png", centres)
    _not_blank(tmp_path / "page.png")
    print(f"page of {len(svgs)} suites and a history of {len(SHA)} commits opened in {opened:.2f} s")


@pytest.mark.slow
def test_a_page_of_100000_rows_opens_in_under_5_s(tmp_path, capsys):
    lengths = [256 * (i + 1) for i in range(100)]
    rows = [data.row("sdpa", n, 1e-9 * n * n, 1000.0 * n, suite="big", label="PyTorch SDPA") for n in lengths]
    for k in range(1, 1000):  # 999 top-k series of 100 lengths: each crosses SDPA at 2000 + k
        rows += [
            data.row("topk", n, 2e-6 * n + 1e-9 * k * n, 900.0 * n + k, suite="big", label="Top-k", topk=k)
            for n in lengths
        ]
    assert len(rows) == 100_000
    data.write(tmp_path / "big", rows, suite="big")
    started = time.perf_counter()
    code, _, err = report(str(tmp_path / "big"), "--out", str(tmp_path / "site"), capsys=capsys)
    written = time.perf_counter() - started
    assert code == 0, err
    page = tmp_path / "site" / "index.html"
    assert page.stat().st_size < 2 << 20  # a summary, not 100,000 rows inlined
    with report_browser.chromium() as browser:
        started = time.perf_counter()
        browser.get(page.as_uri())  # returns once the page has loaded
        opened = time.perf_counter() - started
        loaded_ms = browser.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd")
        rows_shown = browser.execute_script("return document.querySelectorAll('table.pivot tbody tr').length")
        links = browser.execute_script("return Array.from(document.querySelectorAll('p.note a')).map(a => a.href)")
        report_browser.screenshot(browser, page, tmp_path / "big.png", height=1200)
    assert opened < 5.0, f"opened in {opened:.2f} s"
    assert rows_shown == 100  # the table's first 100 rows; the whole of it a CSV beside the page
    table = next(link for link in links if link.endswith(".csv") and "/tables/" in link)
    assert sum(1 for _ in open(Path(table.removeprefix("file://")))) == 1001  # header + 1,000 rows
    _not_blank(tmp_path / "big.png")
    print(f"100,000 rows: report written in {written:.1f} s, opened in {opened:.2f} s (load event {loaded_ms:.0f} ms)")
