"""The test hook ``TOPK_BENCH_TEST_SLOWDOWN`` (topk_bench/measure/slowdown.py): a real, measured slowdown of one
implementation's timed iterations, and bad text an error, never a full-speed run."""

from __future__ import annotations

import time

import pytest

from topk_bench.measure import slowdown


def test_the_factors_are_read_by_implementation_and_bad_text_raises(monkeypatch):
    assert slowdown.factors("topk_fast=1.3, page_topk=2") == {"topk_fast": 1.3, "page_topk": 2.0}
    monkeypatch.setenv(slowdown.VARIABLE, "topk_fast=1.3")
    assert slowdown.factor("topk_fast") == 1.3 and slowdown.factor("sdpa") == 1.0
    for bad in ("topk_fast", "topk_fast=fast", "topk_fast=0.5", "=2", "topk_fast=nan"):
        with pytest.raises(ValueError, match=slowdown.VARIABLE):
            slowdown.factors(bad)


def test_stretch_spins_until_the_factor_times_the_elapsed_time_has_passed():
    start = time.perf_counter()
    time.sleep(0.02)
    end = slowdown.stretch(time.perf_counter, start, 2.0)
    assert end - start >= 0.04 and time.perf_counter() - start < 0.5
    assert slowdown.stretch(time.perf_counter, start, 1.0) - start < 0.5  # not slowed: the clock's reading
