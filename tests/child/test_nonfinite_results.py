"""A NaN or inf in an output, a gradient or an error metric is status nonfinite with its measurement;
a finite one stays ok."""

from __future__ import annotations

import pytest

from locations import TESTS
from topk_bench.case import Case
from topk_bench.child import execute as child
from topk_bench.child.execute import measure
from topk_bench.status import STATUSES, Status

PLUGINS = TESTS / "plugins"


# --- also: a NaN output is a status of its own ---------------------------------------------------------


def _nan_case(tmp_path, mode="fwd_bwd", fidelity=False, which="nan_output") -> Case:
    return Case.make(
        suite="t",
        workload="mha",
        impl=which,
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        mode=mode,
        warmup=0,
        repeats=2,
        fidelity=fidelity,
        plugins=(str(PLUGINS / "nonfinite_impls.py"),),
    )


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_a_nan_output_is_status_nonfinite_with_its_measurement(tmp_path, mode, single_thread):
    result = child.execute(_nan_case(tmp_path, mode))
    assert result.status == Status.NONFINITE == "nonfinite" and "nonfinite" in STATUSES
    assert "NaN" in result.error and result.peak_bytes > 0 and len(result.times_s) == 2


def test_a_nan_gradient_is_nonfinite_and_fidelity_is_not_computed(tmp_path, single_thread):
    result = child.execute(_nan_case(tmp_path, which="nan_gradient", fidelity=True))
    assert result.status == Status.NONFINITE and "gradient" in result.error
    assert "rel_err" not in result.extra


def test_a_nan_error_metric_is_nonfinite(monkeypatch, single_thread):
    from topk_bench.extras import columns as extras

    monkeypatch.setattr(extras, "layer_columns", lambda case, budget: {"rel_err": float("nan"), "grad_cos": 1.0})
    case = Case.make(
        suite="t",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        warmup=0,
        repeats=1,
        fidelity=True,
    )
    result = child.execute(case)
    assert result.status == Status.NONFINITE and "rel_err = nan" in result.error


def test_a_finite_output_stays_ok(single_thread):
    case = Case.make(
        suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2}, warmup=0, repeats=1
    )
    assert measure(case).status == Status.OK
