"""scripts/fit_gpu_time.py: the committed constants are what the script fits again from the committed rows, and
its split never puts one case on both sides, and puts each group of the accuracy table on both."""

from __future__ import annotations

import json
import sys

import pytest

from locations import ROOT
from topk_bench.predict import timing

sys.path.insert(0, str(ROOT / "scripts"))
import fit_gpu_time


def test_the_split_alternates_cases_never_rows_within_each_group():
    def row(case_id, order, group):
        return fit_gpu_time.Row("a.csv", case_id, case_id, order, 1.0, False, group)

    layers, decode = "layers, float32, eager", "decode steps, bfloat16, CUDA graph"
    rows = [
        row("x", ("mha", "a", 1, "f"), layers),
        row("y", ("mha", "a", 2, "f"), layers),
        row("x", ("mha", "a", 1, "f"), layers),  # the same case measured twice: one side
        row("x2", ("mha", "a", 1, "f"), layers),  # ... and from another suite (another id): the same side
        row("u", ("decode", "a", 1, "b"), decode),  # each group starts on the fitted side
        row("v", ("decode", "b", 1, "b"), decode),
    ]
    fit_gpu_time.split(rows)
    assert [r.fit for r in rows] == [True, False, True, True, True, False]


def test_the_groups_are_the_accuracy_tables():
    assert fit_gpu_time.group_of("mha", "float32", False) == "layers, float32, eager"
    assert fit_gpu_time.group_of("decode", "bfloat16", True) == "decode steps, bfloat16, CUDA graph"


@pytest.mark.slow  # predicts the 42 measured cases under FakeTensor: minutes on 2 cores
def test_the_committed_constants_are_the_fit_of_the_committed_rows():
    rows = fit_gpu_time.matched_rows()
    fit_gpu_time.split(rows)
    committed = json.loads(timing.FITTED.read_text())
    assert sorted({r.case_id for r in rows if r.fit}) == committed["fitted_cases"]
    constants = fit_gpu_time.fit(rows)
    for name, value in committed["constants"]["efficiency"].items():
        assert constants.efficiency[name] == pytest.approx(value, rel=1e-3), name
    for name, value in committed["constants"]["block_bytes_per_s"].items():
        assert constants.block_bytes_per_s[name] == pytest.approx(value, rel=1e-3), name
    for name in ("lane_bytes_per_s", "floor_s", "launch_s", "op_s"):
        assert getattr(constants, name) == pytest.approx(committed["constants"][name], rel=1e-3), name
    assert fit_gpu_time.summary(rows, constants) == committed["accuracy"]
