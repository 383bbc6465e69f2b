"""The readers take time linear in the rows: ``show``, ``show --wide``, ``compare`` (with ``--markdown`` and
``--json``) and ``plot`` of 20,000 rows (200 labels by 100 sizes, benchmarks/bench_readers.py's files) each
within a bound generous for a loaded 2-core machine: in seconds, where rows copied or looked up one by one took
minutes. benchmarks/bench_readers.py times them at up to 100,000 rows."""

from __future__ import annotations

import importlib.util
import time

import pytest

from locations import ROOT

ROWS = 20_000
BOUND_S = 60.0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("bench_readers", ROOT / "benchmarks" / "bench_readers.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.files(tmp_path_factory.mktemp("rows"), ROWS)


@pytest.mark.parametrize("command", ["show", "wide", "compare", "plot"])
def test_a_reader_of_20000_rows_takes_seconds(cli, files, tmp_path, command):
    base, new = files
    args = {
        "show": ("show", new),
        "wide": ("show", new, "--wide"),
        "compare": ("compare", base, new, "--markdown", tmp_path / "c.md", "--json", tmp_path / "c.json"),
        "plot": ("plot", new, "--out", tmp_path / "plots"),
    }[command]
    start = time.monotonic()
    result = cli(*args)
    took = time.monotonic() - start
    assert result.code in (0, 1) and "Traceback" not in result.err, result.err[-2000:]
    assert took < BOUND_S, f"{command} of {ROWS} rows took {took:.1f} s"
    if command == "compare":
        assert (tmp_path / "c.md").stat().st_size and (tmp_path / "c.json").read_text().count('"name"') >= ROWS
    if command in ("show", "wide"):
        assert result.out.count("\n") >= 200
