"""The CI regression suite and its committed baseline stay in step (checked without running anything)."""

from locations import ROOT
from topk_bench import attention
from topk_bench.report.stats import min_samples_for
from topk_bench.results.frame import load_results
from topk_bench.run import plan as planning
from topk_bench.run.resolve import Flags

CI_SUITE = ROOT / "suites" / "ci.toml"
BASELINE = ROOT / "baselines" / "ci-predicted.csv"


def test_ci_suite_covers_every_implementation_and_benchmark_workload():
    cases = planning.plan(CI_SUITE, Flags(device="cpu")).cases
    # The gate predicts: every implementation that can be predicted is in it.
    predictable = {name for name in attention.names() if attention.spec(name).predictable}
    assert {c.impl for c in cases} >= predictable
    assert {c.workload for c in cases} == {"mha", "ff", "decoder", "prefill", "decode"}
    # Enough timed samples for compare's Mann-Whitney test to reach alpha = 0.002 (7 at the very least).
    assert all(c.repeats >= min_samples_for(0.002) for c in cases)


def test_committed_baseline_has_exactly_the_ci_suite_cases():
    # A suite edit without a baseline refresh would otherwise show up only as new/missing cases in .ci/run.
    planned = {c.case_id for c in planning.plan(CI_SUITE, Flags(predict=True)).cases}
    baseline = load_results(BASELINE)
    assert set(baseline.case_id) == planned
    assert (baseline.status == "ok").all() and (baseline.method == "predicted").all()
