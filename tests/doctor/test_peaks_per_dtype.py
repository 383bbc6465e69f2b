"""``doctor``'s peak check in each dtype the machine multiplies natively (issue 42): float32 always, bfloat16 and
float16 where the CPU has them in hardware; a dtype it skips is a row saying why."""

import pytest

from topk_bench.attention.shared import hardware
from topk_bench.doctor import peaks
from topk_bench.doctor.check import Result
from topk_bench.predict import cpu_kernels

pytestmark = pytest.mark.usefixtures("single_thread")


def _native(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(hardware, "_cpu_multiplies_natively", lambda dtype: native)


def test_a_cpu_that_emulates_half_products_checks_float32_and_says_why_not_the_others(monkeypatch):
    _native(monkeypatch, False)
    assert peaks.dtypes("cpu")[0] == ["float32"]
    rows = {c.name: c for c in peaks.skipped_dtypes("cpu")}
    assert set(rows) == {"peak = predicted: bfloat16", "peak = predicted: float16"}
    assert all(c.result is Result.SKIPPED for c in rows.values())
    assert "emulates bfloat16 matrix products" in rows["peak = predicted: bfloat16"].detail
    assert "without AVX-512 BF16 or AMX" in rows["peak = predicted: bfloat16"].detail
    assert "without AMX-FP16" in rows["peak = predicted: float16"].detail
    assert all(c.detail.endswith("checked: float32") for c in rows.values())
    assert [c.name for c in peaks.checks_of("vanilla", "cpu")] == ["peak = predicted: vanilla"]


def test_a_cpu_that_multiplies_half_matrices_natively_checks_them_too(monkeypatch):
    _native(monkeypatch, True)
    assert peaks.dtypes("cpu") == (["float32", "bfloat16", "float16"], {})
    assert peaks.skipped_dtypes("cpu") == []
    found = peaks.checks_of("topk_fast", "cpu")
    assert [c.name for c in found] == [
        "peak = predicted: topk_fast",
        "peak = predicted: topk_fast (bfloat16)",
        "peak = predicted: topk_fast (float16)",
    ]
    assert all(c.result is Result.PASS for c in found), [c.detail for c in found]
    assert peaks.dtypes("cuda")[0] == ["float32", "bfloat16", "float16"]  # a GPU multiplies both natively


def test_a_bfloat16_prediction_that_parts_ways_with_the_run_fails_the_check(monkeypatch):
    # The defect of issue 42: the fake run sized embedding_bag's offset2bag by the meta kernel (an index per
    # selected entry in bfloat16), which the CPU kernel never allocates. float32 agreed, so a float32-only
    # doctor passed it.
    _native(monkeypatch, True)
    monkeypatch.setattr(cpu_kernels, "_RULES", {})
    assert peaks.check("topk_fast", "cpu").result is Result.PASS
    wrong = peaks.check("topk_fast", "cpu", dtype="bfloat16")
    assert wrong.result is Result.FAIL and wrong.name == "peak = predicted: topk_fast (bfloat16)", wrong.detail
