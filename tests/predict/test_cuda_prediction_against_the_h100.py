"""``--predict --device cuda`` against an H100: suites/ci.toml at L = 2048, case by case.

Data (tests/data/README.md): ``h100-ci.csv``, measured by ``measure_cuda`` as on main then
(peaks reset after the warm-up, no ``empty_cache``); ``h100-ci-empty-cache.csv``, the
same cases with ``empty_cache()`` just before the reset (issue 14's change). Both read the
baseline after the warm-up, so it holds the cuBLAS workspaces the warm-up allocated; the
prediction reads it after the build, as ``measure_cuda`` does now, and predicts the
workspaces apart (``workspace_bytes``): the measured baseline is the predicted baseline plus
the predicted workspace, to the byte.

Allocated: the peak above that baseline, predicted and measured. ``GAP`` lists, to the byte,
where they differ (all within :data:`PEAK_TOLERANCE`) and why. Reserved: within
:data:`RESERVED_TOLERANCE` of the measurement, but for :data:`RESERVED_MISSES`.
"""

import csv
import dataclasses

import pytest

from locations import ROOT, TESTS
from topk_bench.predict.as_measured import BEFORE_CODE_PATH, run_as_measured
from topk_bench.predict.backends import predict_cuda
from topk_bench.results import columns as col
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags

DATA = TESTS / "data"


@pytest.fixture(autouse=True)
def _the_path_the_h100_ran(monkeypatch):
    """The H100 data predates the code_path column: topk_fast and page_topk ran their torch path as it was then (no
    Triton kernels, the bags path on CUDA). Tests that compare rows set each row's own (:func:`run_as_measured`)."""
    for name, value in BEFORE_CODE_PATH.items():
        monkeypatch.setenv(name, value)


MIB = 1 << 20
PEAK_TOLERANCE = 1 * MIB  # issue 26's targets
RESERVED_TOLERANCE = 0.05

# measured - predicted peak above baseline, in bytes, (without, with empty_cache): where the H100's allocator
# handed out a block whole (a remainder of at most 1 MiB) that the simulation split, or the other way round,
# because a block of the same size was free elsewhere in its cache.
GAP = {
    ("mha", "qchunk_paper"): (-524288, -528896),
    ("mha", "sink_window"): (0, 19968),
}
# (workload, impl, empty_cache): predicted / measured reserved, where outside the tolerance (README, "Predicting
# CUDA"): after empty_cache the H100 reserved 486 MiB; the simulation adds, besides the eight 48 MiB segments of
# the first timed iteration, a 20 MiB, a 12 MiB and two 2 MiB ones for requests its kept blocks could not
# serve: 522 MiB. Without empty_cache both say 530 MiB.
RESERVED_MISSES = {("mha", "qchunk_paper", True): 522 / 486}
FAST = {("ff", "vanilla"), ("ff", "qchunk"), ("ff", "topk"), ("ff", "qchunk_paper")}  # under a second each


def _rows(name):
    with open(DATA / name, newline="") as f:
        return {r["case_id"]: r for r in csv.DictReader(f)}


MEASURED, EMPTIED = _rows("h100-ci.csv"), _rows("h100-ci-empty-cache.csv")
SUITE = [dataclasses.replace(c, device="cuda") for c in plan(ROOT / "suites" / "ci.toml", Flags(device="cpu")).cases]
# Issue 15 added prefill and decode cases to ci.toml after the H100 data was taken: not measured there yet.
NOT_YET_MEASURED = {"prefill", "decode"}
# Implementations added to ci.toml after the H100 contact (docs/sparse.md): no rows of theirs in the data yet.
NOT_YET_MEASURED_IMPLS = {"dsa", "nsa"}
CASES = [c for c in SUITE if c.workload not in NOT_YET_MEASURED and c.impl not in NOT_YET_MEASURED_IMPLS]
PARAMS = [
    pytest.param(c, id=f"{c.workload}-{c.impl}", marks=() if (c.workload, c.impl) in FAST else pytest.mark.slow)
    for c in CASES
]


def test_the_data_covers_every_case_of_the_suite_but_the_inference_workloads():
    assert {c.case_id for c in CASES} == set(MEASURED) == set(EMPTIED)
    assert NOT_YET_MEASURED <= {c.workload for c in SUITE}  # drop an entry here once its rows are in the data


@pytest.mark.parametrize("case", PARAMS)
def test_prediction_against_the_h100(case, monkeypatch):
    run_as_measured(monkeypatch, MEASURED[case.case_id])
    gaps = GAP.get((case.workload, case.impl), (0, 0))
    for rows, empty_cache, gap in ((MEASURED, False, gaps[0]), (EMPTIED, True, gaps[1])):
        real = {k: int(rows[case.case_id][k]) for k in ("peak_bytes", "reserved_bytes", "baseline_bytes")}
        pred = predict_cuda(case, empty_cache=empty_cache)
        workspace = pred.extra[col.WORKSPACE_BYTES]
        assert real["baseline_bytes"] == pred.baseline_bytes + workspace  # the H100 read it after the warm-up
        above = pred.peak_bytes - pred.baseline_bytes - workspace
        assert (real["peak_bytes"] - real["baseline_bytes"]) - above == gap and abs(gap) <= PEAK_TOLERANCE
        ratio = pred.reserved_bytes / real["reserved_bytes"]  # off by |ratio - 1| of the measurement
        miss = RESERVED_MISSES.get((case.workload, case.impl, empty_cache))
        if miss is None:
            assert abs(ratio - 1) <= RESERVED_TOLERANCE + 1e-12, (empty_cache, ratio)
        else:
            assert ratio == pytest.approx(miss, abs=1e-9), empty_cache
        assert pred.extra[col.CUDA_UNMODELED_OPS] == UNMODELLED.get((case.workload, case.impl), "")


# The ops the prediction says it does not model, per case (empty: all of them are).
UNMODELLED = {
    ("mha", "performer"): "aten.linalg_qr.default",
    ("mha", "topk_sparse"): "aten._sparse_addmm.default;aten._sparse_coo_tensor_with_dims_and_tensors.default;"
    "aten.addmm_.default",
}


def test_the_workspaces_are_those_of_the_h100_one_cublas_per_thread_and_cublaslt_for_a_bias():
    """65 MiB on the H100 for a layer with a biased projection (forward and backward threads' cuBLAS, the
    forward's cuBLASLt), 64 MiB for the feed-forward, whose linears have no bias; 32 MiB less without backward
    GEMMs; the baseline holds none."""
    sizes = {}
    for case in SUITE:
        if (case.workload, case.impl) in (("mha", "vanilla"), ("ff", "vanilla")):
            sizes[case.workload] = predict_cuda(case).extra[col.WORKSPACE_BYTES]
    assert sizes == {"mha": 65 * MIB, "ff": 64 * MIB}


# -- the H100 of 2026-11-26: measure_cuda as it is now ------------------------------------------------------------
# tests/data/h100-2026-11-26 (its README): suites/ci.toml (21 of its 28 cases) and suites/mha.toml (512 to 16K tokens,
# Performer to 32K), measured by today's measure_cuda: the baseline read after the build, the workspaces the warm-up
# left apart (workspace_bytes), empty_cache before the peaks' reset. Peaks and baselines compare as they are.
NOW = TESTS / "data" / "h100-2026-11-26"
# (workload, impl, seq_len): measured / predicted reserved, where outside the tolerance. SDPA's backward on sm90
# (efficient attention) reserved more than the simulation at 4K and 16K, though its allocations are exact to the
# byte: no allocator history of it was taken (the next GPU session's first profile).
RESERVED_MISSES_NOW = {("mha", "sdpa", 4096): 1.103, ("mha", "sdpa", 16384): 1.144}


def _now(suite: str) -> list:
    cases = {
        c.case_id: c
        for c in (
            dataclasses.replace(c, device="cuda")
            for c in plan(ROOT / "suites" / f"{suite}.toml", Flags(device="cpu"), yes=True).cases
        )
    }
    with open(NOW / f"{suite}.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    return [
        pytest.param(
            cases[r["case_id"]],
            r,
            id=f"{suite}-{r['workload']}-{r['impl']}-{r['seq_len'] or r['kv_len']}",
            marks=() if (r["workload"], r["impl"]) in FAST else pytest.mark.slow,
        )
        for r in rows
    ]


@pytest.mark.parametrize("case,row", _now("ci") + _now("mha"))
def test_prediction_against_the_h100_as_measured_now(case, row, monkeypatch):
    """Every ok row: allocated peak, baseline and workspace as predicted (to the byte, but the block the H100 did
    not split: GAP), reserved within the tolerance but for the misses named."""
    run_as_measured(monkeypatch, row)
    pred = predict_cuda(case)
    gap = GAP.get((case.workload, case.impl), (0, 0))[1] if case.workload == "mha" and row["seq_len"] == "2048" else 0
    assert int(row["baseline_bytes"]) == pred.baseline_bytes
    assert int(row["workspace_bytes"]) == pred.extra[col.WORKSPACE_BYTES]
    assert int(row["peak_bytes"]) - pred.peak_bytes == gap
    ratio = int(row["reserved_bytes"]) / pred.reserved_bytes
    miss = RESERVED_MISSES_NOW.get((case.workload, case.impl, int(row["seq_len"] or 0)))
    if miss is None:
        assert abs(ratio - 1) <= RESERVED_TOLERANCE, ratio
    else:
        assert ratio == pytest.approx(miss, abs=5e-4)


def test_the_h100_rows_predate_code_path_so_they_ran_the_bags_path():
    """Were a row to carry ``code_path``, :func:`run_as_measured` would follow it; these predate the column."""
    for row in (*MEASURED.values(), *EMPTIED.values(), *(p.values[1] for p in _now("ci") + _now("mha"))):
        assert "code_path" not in row


def test_the_h100_data_of_now_covers_prefill_and_decode():
    workloads = {p.values[0].workload for p in _now("ci")}
    assert {"prefill", "decode", "mha", "ff", "decoder"} <= workloads


def test_performer_builds_no_cublas_workspace_on_the_host():
    """doctor --device cuda on the H100 (tests/data/h100-2026-11-26/doctor.txt): Performer's tiny case measured
    a baseline of 21,504 B and a workspace of 68,157,440 B; the prediction said 33,575,936 and 34,603,008: its
    random features, drawn on the host with one matrix product in the build, counted as a cuBLAS call on the GPU.
    The features are now scaled without a product (the same bits); the prediction is the measurement."""
    from topk_bench.doctor import tiny
    from topk_bench.types import Method

    pred = predict_cuda(tiny.case("performer", device="cuda", method=Method.PREDICTED))
    assert (pred.baseline_bytes, pred.extra[col.WORKSPACE_BYTES]) == (21_504, 68_157_440)
    assert pred.peak_bytes - pred.baseline_bytes - pred.extra[col.WORKSPACE_BYTES] == 38_912
    assert pred.reserved_bytes == 69_206_016


def _topk_fast_cuda():
    """topk_fast's rows of suites/topk_fast_cuda.toml measured on the H100 (float32, 4K to 16K), with their cases,
    matched by length: the rows keep the case ids of their day (topk_fast has gained options since)."""
    plan_ = plan(ROOT / "suites" / "topk_fast_cuda.toml", Flags(device="cpu"), yes=True)
    cases = {
        dict(c.params)["seq_len"]: dataclasses.replace(c, device="cuda") for c in plan_.cases if c.impl == "topk_fast"
    }
    with open(NOW / "topk_fast_cuda-float32.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["impl"] == "topk_fast" and r["status"] == "ok"]
    return [
        pytest.param(
            cases[int(r["seq_len"])], r, id=r["seq_len"], marks=() if r["seq_len"] == "4096" else pytest.mark.slow
        )
        for r in rows
    ]


@pytest.mark.parametrize("case,row", _topk_fast_cuda())
def test_topk_fast_training_is_predicted_on_the_path_it_ran(case, row, monkeypatch):
    """The bags path the H100 ran predicts its allocated and reserved peaks to the byte; the batched path's larger
    tiles and backward groups (topk_bench/attention/shared/cuda_torch.py) would not: the row must be predicted on its
    own path."""
    run_as_measured(monkeypatch, row)
    pred = predict_cuda(case)
    measured = (int(row["peak_bytes"]), int(row["reserved_bytes"]), int(row["baseline_bytes"]))
    assert (pred.peak_bytes, pred.reserved_bytes, pred.baseline_bytes) == measured
    monkeypatch.setenv("TOPK_BENCH_CUDA_TORCH", "batched")
    assert predict_cuda(case).peak_bytes > int(row["peak_bytes"])
