"""``compare --relative-to sdpa`` takes time linear in the rows: each case finds its reference by a lookup, not by
a pass over every reference row (1,000 rows a side took 31 s, 4,000 did not finish in 300 s). 20,000 rows a side
here, within a bound generous for a loaded 2-core machine; benchmarks/bench_relative.py times 100,000."""

from __future__ import annotations

import importlib.util
import time

import pytest

from locations import ROOT

ROWS = 20_000
BOUND_S = 60.0


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_relative", ROOT / "benchmarks" / "bench_relative.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_compare_relative_to_of_20000_rows_a_side_takes_seconds(cli, bench, tmp_path):
    base = bench.generate(tmp_path / "base.csv", ROWS, seed=1)
    new = bench.generate(tmp_path / "new.csv", ROWS, seed=2, slower=1.5)
    start = time.monotonic()
    result = cli("compare", base, new, "--relative-to", "sdpa", "--json", tmp_path / "c.json")
    took = time.monotonic() - start
    assert result.code == 0 and "Traceback" not in result.err, result.err[-2000:]
    # topk_fast 1.5x SDPA's in NEW: each case judged over SDPA's rounds (3 rounds: too few to reach alpha)
    assert f"{ROWS - ROWS // bench.PER_SIZE} inconclusive" in result.out, result.out[-500:]
    assert took < BOUND_S, f"compare --relative-to of {ROWS} rows a side took {took:.1f} s"
    assert (tmp_path / "c.json").read_text().count("per round; inconclusive") == ROWS - ROWS // bench.PER_SIZE
