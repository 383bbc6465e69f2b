"""Per-stage cost (topk_bench.measure.stages): each marked stage's peak from the live-bytes tracker (the same
measured and predicted), each stage's seconds from one extra iteration, forward and backward told apart."""

import json

import pytest
import torch

from topk_bench.attention.shared import stages as marks
from topk_bench.case import Case
from topk_bench.child.execute import execute
from topk_bench.measure.memory import LiveBytes
from topk_bench.measure.stages import CudaPeaks, StageMeter, TrackerPeaks, timed_stages
from topk_bench.results import columns as col
from topk_bench.results.stage_cells import cells as columns
from topk_bench.results.stage_cells import read

pytestmark = pytest.mark.usefixtures("single_thread")

MIB = 1 << 20


def test_a_stage_peak_is_the_highest_live_bytes_inside_it_and_the_whole_peak_is_untouched():
    tracker = LiveBytes()
    meter = StageMeter(peaks=TrackerPeaks(tracker))
    with tracker, meter.listening():
        big = torch.empty(4 * MIB, dtype=torch.uint8)  # 4 MiB before any stage: the whole peak
        del big
        with marks.stage("outer"):
            a = torch.empty(MIB, dtype=torch.uint8)
            with marks.stage("inner"):
                b = torch.empty(2 * MIB, dtype=torch.uint8)
                del b
            del a
        with marks.stage("inner"):  # entered twice: the larger of the two
            c = torch.empty(MIB // 2, dtype=torch.uint8)
            del c
    assert meter.peak_bytes == {"forward.outer": 3 * MIB, "forward.inner": 3 * MIB}
    assert tracker.peak_bytes == 4 * MIB and tracker.watermarks == []  # the iteration's peak is its own


def test_backward_stages_are_keyed_apart_and_times_sum_over_entries():
    class Marked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with marks.stage("attention"):
                return x * 2

        @staticmethod
        def backward(ctx, g):
            with marks.stage("attention"):
                return g * 2

    ticks = iter(range(100))
    x = torch.ones(3, requires_grad=True)

    def iteration():
        for _ in range(2):  # a chunked loop: two entries, one key
            Marked.apply(x).sum().backward()

    times = timed_stages(iteration, clock=lambda: float(next(ticks)))
    assert times == {"forward.attention": 2.0, "backward.attention": 2.0}


def test_columns_are_sorted_json_objects_and_read_back():
    cells = columns({"forward.selection": 0.5, "backward.attention": 1.25}, {"forward.selection": 7})
    assert list(json.loads(cells[col.STAGE_TIMES_S])) == ["backward.attention", "forward.selection"]
    assert read(cells[col.STAGE_TIMES_S]) == {"backward.attention": 1.25, "forward.selection": 0.5}
    assert read(cells[col.STAGE_PEAK_BYTES]) == {"forward.selection": 7.0}
    assert read("") == {} and read(float("nan")) == {}
    assert columns(None, {}) == {}


def _case(impl, **fields):
    options = {"topk": 8, "chunk_size": 16, "index_heads": 2, "index_head_dim": 8} if impl == "dsa" else {}
    return Case.make(
        suite="test",
        workload="mha",
        impl=impl,
        params={"seq_len": 48, "d_model": 32, "heads": 2},
        options=options,
        causal=True,
        warmup=0,
        repeats=1,
        **fields,
    )


def test_dsa_rows_carry_stages_measured_and_predicted_alike():
    measured = execute(_case("dsa"))
    predicted = execute(_case("dsa", method="predicted"))
    assert measured.status == predicted.status == "ok", (measured.error, predicted.error)
    peaks = read(measured.extra[col.STAGE_PEAK_BYTES])
    assert set(peaks) == {"forward.indexer", "forward.selection", "forward.attention", "backward.attention"}
    assert read(predicted.extra[col.STAGE_PEAK_BYTES]) == peaks  # exact, as peak_bytes is
    assert max(peaks.values()) <= measured.peak_bytes
    assert all(v > measured.baseline_bytes for v in peaks.values())
    times = read(measured.extra[col.STAGE_TIMES_S])
    assert set(times) == set(peaks) and all(t > 0 for t in times.values())
    assert col.STAGE_TIMES_S not in predicted.extra  # nothing ran: no time


def test_an_implementation_without_stages_gets_no_stage_columns():
    measured = execute(_case("vanilla"))
    assert measured.status == "ok"
    assert col.STAGE_TIMES_S not in measured.extra and col.STAGE_PEAK_BYTES not in measured.extra


class _Allocator:
    """The CUDA allocator's peak statistics, as torch.cuda exposes them (a stand-in on the CPU)."""

    def __init__(self):
        self.allocated = self.peak = 0

    def alloc(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def reset_peak_memory_stats(self, device):
        self.peak = self.allocated

    def max_memory_allocated(self, device):
        return self.peak


def test_cuda_stage_peaks_survive_the_resets_of_nested_stages():
    cuda = _Allocator()
    meter = StageMeter(peaks=CudaPeaks(torch.device("cpu"), cuda))
    with meter.listening():
        with marks.stage("outer"):
            cuda.alloc(5)  # the outer stage's peak, before the inner stage resets the statistics
            cuda.alloc(-5)
            with marks.stage("inner"):
                cuda.alloc(2)
                cuda.alloc(-2)
    assert meter.peak_bytes == {"forward.outer": 5, "forward.inner": 2}


@pytest.mark.slow  # a measured profile: its iteration under torch.profiler besides the attributed one
def test_a_measured_profile_names_the_stages(tmp_path):
    """profile.json's stages are the row's; ops.csv and trace.json hold the stage:<name> ranges."""
    import csv
    import dataclasses

    from topk_bench.capture import capture, files
    from topk_bench.case import Budget

    case = dataclasses.replace(_case("dsa"), profile=str(tmp_path / "profile"))
    result = capture.measure(case, Budget())
    assert result.status == "ok", result.error
    info, _ = files.read(tmp_path / "profile")
    peaks = read(result.extra[col.STAGE_PEAK_BYTES])
    assert {k: v["peak_bytes"] for k, v in info["stages"].items()} == peaks
    assert all(v["time_s"] > 0 for v in info["stages"].values())
    ops = {r["op"] for r in csv.DictReader(open(tmp_path / "profile" / "ops.csv"))}
    assert {"stage:indexer", "stage:selection", "stage:attention"} <= ops
