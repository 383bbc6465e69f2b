"""Peak memory and time of one case measured in this process, on the CPU or on CUDA, with one result shape.

- ``cpu``: peak = live tensor bytes (:class:`~topk_bench.measure.memory.LiveBytes`) of the
  profiling iteration; time = ``perf_counter`` (or, ``timer = "process_time"``, the process's CPU seconds) of
  the timed iterations, which run untracked (the tracker's per-op cost would otherwise inflate small shapes).
- ``cuda``: baseline after the build; under our protocol warm-up, the workspace it left,
  ``empty_cache`` and ``reset_peak_memory_stats``; under the paper's no warm-up and no reset;
  ``max_memory_allocated`` / ``max_memory_reserved`` over the measured iterations, CUDA events around
  forward and backward (or around each replay of a CUDA graph: ``timer = "cudagraph"``), TF32 off.
  What it calls of ``torch.cuda`` goes through one object (``cuda``), so that a stand-in can run its
  steps on the CPU.

Which iterations run, on which model and inputs, and which are timed is the case's
protocol's: :mod:`topk_bench.measure.iterations`, for every backend. Each counts the ops of its
profiling iteration (``ops_per_iter``, :mod:`topk_bench.measure.ops`). One iteration is
:func:`topk_bench.measure.steps.iteration`. Failures raise; :func:`topk_bench.child.execute.execute` turns
them into statuses.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import Unsupported
from topk_bench.measure import iterations, metadata, stages
from topk_bench.measure.memory import AllocatorBytes, LiveBytes
from topk_bench.measure.ops import OpCount, OpCounter, ProfiledOps
from topk_bench.measure.steps import build, check_supported, checked, iteration, nonfinite, ok_result, ops_columns
from topk_bench.results import columns as col
from topk_bench.types import DeviceKind, Timer
from topk_bench.units import MIB
from topk_bench.workloads import Workload

# A cache flush zeroes a buffer this many times the cache (triton.testing.do_bench: 256 MB on any GPU).
FLUSH_FACTOR = 2
# The CPU's largest cache when the system does not say.
CPU_CACHE_FALLBACK = 32 * MIB
# Eager iterations on a side stream before one is captured in a CUDA graph (torch.cuda.graph's advice).
GRAPH_WARMUP = 2


def _timings(samples: list[tuple[float, float]], case: Case, *, split: bool = True) -> dict[str, list[float]]:
    """The samples as a measurement's times; ``split``: forward and backward apart (not a graph replay's)."""
    fwd = [f for f, _ in samples] if split else []
    bwd = [b for _, b in samples] if split and case.mode.backward else []
    return {"fwd_times_s": fwd, "bwd_times_s": bwd, "times_s": [f + b for f, b in samples]}


def _measured_columns(case: Case, steps: CpuSteps | CudaSteps) -> dict:
    """A measured row's columns of how it was timed, what it dispatched and what its compilation took: what the
    steps did (:class:`~topk_bench.measure.iterations.Steps`), whatever the case asked."""
    columns = {
        col.TIMER: Timer.CUDAGRAPH if steps.graph_replays else steps.timer,
        col.GRAPH_REPLAYS: steps.graph_replays,
        col.LOOPS: steps.loops,
        col.FLUSH_L2: case.flush_l2,
        col.RAN_DTYPE: steps.ran_dtype,
        col.COMPILED: None if steps.compiled_graphs is None else steps.compiled_graphs > 0,
        **ops_columns(steps.counted, cuda=isinstance(steps, CudaSteps)),
    }
    if steps.compile_s is not None:
        columns[col.COMPILE_S] = steps.compile_s
    return columns


# The CPU's clocks, by timer: wall time, or the CPU seconds of every thread of the process (``time``'s functions,
# looked up when a case starts).
CPU_CLOCKS = {Timer.PERF_COUNTER: "perf_counter", Timer.PROCESS_TIME: "process_time"}


class CpuSteps(iterations.Steps[Workload]):
    """Live bytes, FLOPs and ops from the profiling iteration, times from the case's CPU clock (``perf_counter``
    unless it asks ``process_time``)."""

    def __init__(self, case: Case, budget: Budget):
        self.case, self.budget = case, budget
        self.timer = case.timer if case.timer in CPU_CLOCKS else Timer.PERF_COUNTER
        self.clock: Callable[[], float] = getattr(time, CPU_CLOCKS[self.timer])
        self.tracker: LiveBytes | AllocatorBytes | None = None
        self.flops: int | None = None
        self.counted = OpCount()
        self.losses: list[torch.Tensor] = []
        self.problem = ""
        self._flush: torch.Tensor | None = None
        # Per-stage cost of an implementation that marks stages (topk_bench.measure.stages).
        self.stage_peaks: dict[str, int] = {}
        self.stage_times: dict[str, float] = {}

    def build(self) -> Workload:
        return build(self.case, "cpu")

    def profile(self, wl: Workload) -> None:
        # No dispatch mode can follow a compiled call (flex, compile = true): the allocator's own reports and
        # the profiler's ops, and no FLOPs (the FLOP counter is a mode too).
        if iterations.compiles(self.case):
            allocator = self.allocator_bytes()
            self.tracker = allocator
            allocator.register(wl.model, wl.inputs, wl.kept)
            with allocator:
                iteration(wl, self.case)
            self.flops, self.counted = None, allocator.counted
            return
        live = self.live_bytes()
        self.tracker = live
        live.register(wl.model, wl.inputs, wl.kept)
        with (
            FlopCounterMode(display=False) as flops,
            OpCounter() as ops,
            live,
            stages.peaks_of(self.case, live) as meter,
        ):
            iteration(wl, self.case)
        self.flops, self.counted = flops.get_total_flops(), ops.counted
        self.stage_peaks = meter.peak_bytes if meter is not None else {}

    def live_bytes(self) -> LiveBytes:
        """The tracker of the profiling iteration (a profile's counts more: :mod:`topk_bench.profile`)."""
        return LiveBytes(limit=self.budget.max_memory_bytes)

    def allocator_bytes(self) -> AllocatorBytes:
        """The tracker of a compiled call's profiling iteration (a profile's names its allocations)."""
        return AllocatorBytes()

    def warm_up(self, wl: Workload) -> None:
        iteration(wl, self.case)

    def timed(self, wl: Workload) -> iterations.Pending:
        sample = iteration(wl, self.case, self.clock, self.losses)
        return lambda: sample

    def flush(self) -> None:
        """Zero a buffer of twice the CPU's largest cache."""
        if self._flush is None:
            size = FLUSH_FACTOR * (metadata.last_level_cache_bytes() or CPU_CACHE_FALLBACK)
            self._flush = torch.empty(size // 4, dtype=torch.int32)
        self._flush.zero_()

    def finish(self, wl: Workload) -> None:
        self.problem = nonfinite(wl, self.losses[-1])
        if stages.marks_stages(self.case):  # one extra, untimed iteration: each stage's seconds
            self.stage_times = stages.timed_stages(lambda: iteration(wl, self.case))


def measure_cpu(case: Case, budget: Budget, make_steps: Callable[[Case, Budget], CpuSteps] = CpuSteps) -> Measurement:
    check_supported(case, predict=False)
    steps = make_steps(case, budget)
    samples = iterations.run(case, steps)
    tracker = steps.tracker
    assert tracker is not None, "set by the profiling iteration"
    result = ok_result(
        case,
        peak_bytes=tracker.peak_bytes,
        baseline_bytes=tracker.baseline_bytes,
        flops=steps.flops,
        **_timings(samples, case),
    )
    result.metadata.update(steps.contention.summary())
    result.extra.update(_measured_columns(case, steps))
    result.extra.update(stages.columns(steps.stage_times, steps.stage_peaks))
    return checked(result, steps.problem)


class CudaSteps(iterations.Steps[Workload]):
    """The caching allocator's peaks over the measured iterations, CUDA events around forward and backward, or
    around each replay of a captured iteration. ``cuda``: what is called of ``torch.cuda`` (a stand-in on the
    CPU in tests); ``clock``: the host's clock the warm-up is timed by."""

    timer = Timer.EVENTS
    captures = True

    def __init__(
        self, case: Case, device: torch.device, cuda=torch.cuda, clock: Callable[[], float] = time.perf_counter
    ):
        self.case, self.device, self.cuda, self.clock = case, device, cuda, clock
        self.flops: int | None = None
        self.counted = OpCount()
        self.after_build: int | None = None
        self.baseline: int | None = None
        self.workspace: int | None = None
        self.peak: int | None = None
        self.reserved: int | None = None
        self.losses: list[torch.Tensor] = []
        self.problem = ""
        self.graph: torch.cuda.CUDAGraph | None = None
        self._flush: torch.Tensor | None = None
        self.stage_peaks: dict[str, int] = {}
        self.stage_times: dict[str, float] = {}

    def build(self) -> Workload:
        wl = build(self.case, self.device)
        self.cuda.synchronize(self.device)
        self.after_build = self.cuda.memory_allocated(self.device)  # parameters and inputs, before any iteration
        return wl

    def profile(self, wl: Workload) -> None:
        """Ours: the first warm-up (cuBLAS workspaces, kernels), counting FLOPs and ops; a compiled call under the
        profiler only (under a dispatch mode torch.compile would skip its frame and run it unfused)."""
        if iterations.compiles(self.case):
            with ProfiledOps() as profiled:
                iteration(wl, self.case)
            self.counted = profiled.counted
            return
        meter = stages.StageMeter(peaks=stages.CudaPeaks(self.device, self.cuda))
        marked = stages.marks_stages(self.case)
        with FlopCounterMode(display=False) as flops, OpCounter() as ops:
            with meter.listening() if marked else contextlib.nullcontext():
                iteration(wl, self.case)
        self.flops, self.counted = flops.get_total_flops(), ops.counted
        self.stage_peaks = meter.peak_bytes

    def warm_up(self, wl: Workload) -> None:
        iteration(wl, self.case)

    def sync(self) -> None:
        self.cuda.synchronize(self.device)

    def now(self) -> float:
        self.sync()
        return self.clock()

    def start(self, wl: Workload, *, reset_peak: bool) -> None:
        """The baseline is what ``wl``'s build left allocated. With the reset (ours), the warm-up has run:
        what it left besides (cuBLAS workspaces) is ``workspace``, and ``empty_cache`` returns the segments it
        cached so that the reserved peak is the measured region's own."""
        self.baseline = self.after_build
        if reset_peak:
            self.sync()
            self.workspace = self.cuda.memory_allocated(self.device) - self.baseline
            self.cuda.empty_cache()
            self.cuda.reset_peak_memory_stats(self.device)

    def _events(self, n: int) -> list:
        return [self.cuda.Event(enable_timing=True) for _ in range(n)]

    def timed(self, wl: Workload) -> iterations.Pending:
        start, mid, end = self._events(3)
        marks = iter((start, mid, end))
        # The "clock" records the next event; durations are read from the events once synchronised.
        iteration(wl, self.case, clock=lambda: next(marks).record() or 0.0, losses=self.losses)
        return lambda: (start.elapsed_time(mid) / 1e3, mid.elapsed_time(end) / 1e3)  # elapsed_time is in ms

    def finish(self, wl: Workload) -> None:
        self.peak = self.cuda.max_memory_allocated(self.device)
        self.reserved = self.cuda.max_memory_reserved(self.device)
        self.problem = nonfinite(wl, self.losses[-1])  # after the peaks: the check allocates
        if stages.marks_stages(self.case):  # one extra, untimed iteration, synchronised at each stage boundary
            self.stage_times = stages.timed_stages(lambda: iteration(wl, self.case), clock=self.now)

    def flush(self) -> None:
        """Zero a buffer of twice the device's L2, on the stream the iterations run on."""
        if self._flush is None:
            l2 = self.cuda.get_device_properties(self.device).L2_cache_size
            self._flush = torch.empty(FLUSH_FACTOR * l2 // 4, dtype=torch.int32, device=self.device)
        self._flush.zero_()

    def capture(self, wl: Workload) -> None:
        """As triton.testing.do_bench_cudagraph and torch.cuda.graph's documentation: eager iterations on a side
        stream, then one iteration captured (gradients set to None first, so that backward allocates them from
        the graph's pool); unlike do_bench_cudagraph, one iteration per graph, so that each replay is a sample
        and a cache flush can run between replays. A case that cannot be captured is ``unsupported``."""
        current = self.cuda.current_stream(self.device)
        side = self.cuda.Stream(self.device)
        side.wait_stream(current)
        with self.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                iteration(wl, self.case)
        current.wait_stream(side)
        wl.clear_grads()
        self.graph = self.cuda.CUDAGraph()
        try:
            with self.cuda.graph(self.graph):
                iteration(wl, self.case)
        except RuntimeError as exc:
            line = (str(exc).strip().splitlines() or [""])[0][:200]
            raise Unsupported(f"timer = 'cudagraph': this case cannot be captured in a CUDA graph ({line})") from exc
        self.sync()

    def replay(self) -> iterations.Pending:
        start, end = self._events(2)
        start.record()
        assert self.graph is not None, "replay() after capture()"
        self.graph.replay()
        end.record()
        return lambda: (start.elapsed_time(end) / 1e3, 0.0)


def measure_cuda(
    case: Case, budget: Budget, make_steps: Callable[..., CudaSteps] = CudaSteps, *, cuda=torch.cuda
) -> Measurement:
    """The paper's method; under our protocol with its weaknesses fixed (warm-up, peak reset, baseline and
    workspace reported). Under the paper protocol: no warm-up, no reset, no ``empty_cache``, no workspace
    column (the first, cold iteration allocates it inside the measured region, as theirs did).

    - ``baseline_bytes``: allocated right after the build, before any iteration: parameters and inputs,
      as on the CPU and in predictions;
    - ``workspace_bytes`` (a result column): what the warm-up left allocated besides them (cuBLAS and
      cuBLASLt workspaces: 65 MiB on an H100 with torch 2.11), live through every timed iteration, so that
      ``peak_bytes - workspace_bytes`` compares with the CPU's and the predicted peak;
    - ``peak_bytes`` / ``reserved_bytes``: ``max_memory_allocated`` / ``max_memory_reserved`` of the measured
      (eager) iterations. ``empty_cache()`` before the reset gives back the segments the warm-up cached and no
      longer uses, so that the reserved peak is the measured region's own, not the warm-up's.

    The memory budget is checked against these peaks afterwards
    (:func:`topk_bench.child.worker.over_budget`): a failed allocation here means the device ran out.
    """
    check_supported(case, predict=False)
    if not cuda.is_available():
        raise RuntimeError("CUDA is not available on this machine")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(case.device)
    if device.index is None:
        device = torch.device("cuda", cuda.current_device())
    # Events record on the current device's current stream: make the case's device current.
    with cuda.device(device):
        steps = make_steps(case, device, cuda)
        samples = iterations.run(case, steps)
        result = ok_result(
            case,
            peak_bytes=steps.peak,
            reserved_bytes=steps.reserved,
            baseline_bytes=steps.baseline,
            flops=steps.flops,
            **_timings(samples, case, split=not steps.graph_replays),
        )
        result.metadata.update(steps.contention.summary())
        if steps.workspace is not None:
            result.extra[col.WORKSPACE_BYTES] = steps.workspace
        result.extra.update(_measured_columns(case, steps))
        result.extra.update(stages.columns(steps.stage_times, steps.stage_peaks))
        return checked(result, steps.problem)


MEASURING: dict[DeviceKind, Callable[[Case, Budget], Measurement]] = {
    DeviceKind.CPU: measure_cpu,
    DeviceKind.CUDA: measure_cuda,
}
