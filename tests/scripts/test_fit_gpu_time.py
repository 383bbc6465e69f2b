"""scripts/fit_gpu_time.py: the committed constants are what the script fits again from the committed rows, and
its split never puts one case on both sides."""

from __future__ import annotations

import json
import sys

import pytest

from locations import ROOT
from topk_bench.predict import timing

sys.path.insert(0, str(ROOT / "scripts"))
import fit_gpu_time


def test_the_split_alternates_cases_never_rows():
    rows = [
        fit_gpu_time.Row("a.csv", case_id, case_id, order, 1.0, False)
        for case_id, order in (("x", ("mha", "a", 1, "f")), ("y", ("mha", "a", 2, "f")), ("x", ("mha", "a", 1, "f")))
    ]
    fit_gpu_time.split(rows)
    assert [r.fit for r in rows] == [True, False, True]


@pytest.mark.slow  # predicts the 42 measured cases under FakeTensor: minutes on 2 cores
def test_the_committed_constants_are_the_fit_of_the_committed_rows():
    rows = fit_gpu_time.matched_rows()
    fit_gpu_time.split(rows)
    committed = json.loads(timing.FITTED.read_text())
    assert sorted({r.case_id for r in rows if r.fit}) == committed["fitted_cases"]
    constants = fit_gpu_time.fit(rows)
    for name, value in committed["constants"]["efficiency"].items():
        assert constants.efficiency[name] == pytest.approx(value, rel=1e-3), name
    assert constants.launch_s == pytest.approx(committed["constants"]["launch_s"], rel=1e-3)
    assert fit_gpu_time.summary(rows, constants) == committed["accuracy"]
