"""Peak memory and time of one case, in this process, on one of three backends with one result shape.

- ``cpu``: peak = live tensor bytes (:class:`~topk_bench.memory.LiveBytes`) of the
  profiling iteration; time = ``perf_counter`` of the timed iterations, which run untracked
  (the tracker's per-op cost would otherwise inflate small shapes).
- ``cuda``: baseline after the build; under our protocol warm-up, the workspace it left,
  ``empty_cache`` and ``reset_peak_memory_stats``; under the paper's no warm-up and no reset;
  ``max_memory_allocated`` / ``max_memory_reserved`` over the timed iterations, CUDA events around
  forward and backward, TF32 off.
- ``predict``: the tracker under ``FakeTensorMode`` on the CPU device (``meta``
  would send SDPA down another path): exact allocated bytes at any size, nothing
  allocated, FLOPs from ``FlopCounterMode``. For a CUDA case the same run's
  allocations go through a simulation of the caching allocator
  (:mod:`~topk_bench.measure.cuda_allocator`), replayed as ``measure_cuda`` runs them.

Which iterations run, on which model and inputs, and which are timed is the case's
protocol's: :mod:`topk_bench.measure.iterations`, for both measuring backends.
An iteration is the paper's: forward, ``loss = out.mean()``, backward. Mode
``fwd`` runs the forward under ``torch.no_grad()`` (the paper's chunk-size figure
is forward only: no activations are kept for backward). Gradients of the
previous iteration are dropped before each one, so each starts from the same
live set: parameters, inputs and kept tensors, reported as ``baseline_bytes``.
Failures raise; :func:`topk_bench.measure.worker.execute` turns them into statuses.
A measured case whose last iteration left a NaN or inf (in the output, or a
gradient) keeps its numbers with status ``nonfinite``: fast garbage is no result.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from implementations import hardware
from topk_bench import workloads
from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import Unsupported
from topk_bench.protocol import OURS
from topk_bench.measure import iterations, metadata
from topk_bench.measure.memory import AllocationTrace, AllocatorBytes, LiveBytes
from topk_bench.measure.simulated import simulate
from topk_bench.results import columns as col
from topk_bench.status import Status
from topk_bench.types import DeviceKind
from topk_bench.workloads import Workload
from topk_bench.workloads.support import unsupported


def dtype_of(case: Case) -> torch.dtype:
    return case.dtype.to_torch()


def check_supported(case: Case, *, predict: bool) -> None:
    problem = unsupported(case, predict=predict)
    if problem:
        raise Unsupported(problem)


def build(case: Case, device) -> Workload:
    """The case's workload; for mode ``fwd`` nothing requires grad.

    (``no_grad`` alone is not enough: FlopCounterMode's module tracker trips over
    views of parameters that require grad inside ``no_grad``.)
    """
    wl = workloads.build(case, device, dtype_of(case))
    if not case.mode.backward:
        for t in (*wl.model.parameters(), *wl.inputs):
            t.requires_grad_(False)
    return wl


def grad_context(case: Case):
    return contextlib.nullcontext() if case.mode.backward else torch.no_grad()


def iteration(wl: Workload, case: Case, clock: Callable[[], float] | None = None,
              losses: list[torch.Tensor] | None = None) -> tuple[float, float]:
    """One forward (+ backward); returns (forward, backward) seconds when given a clock.

    ``out`` stays alive through backward, as in a benchmark script that keeps it.
    ``losses`` receives the detached loss (one scalar), to be checked after the timed region.
    """
    wl.clear_grads()
    with grad_context(case):
        t0 = clock() if clock else 0.0
        out = wl()
        loss = out.mean()
        t1 = clock() if clock else 0.0
        if case.mode.backward:
            loss.backward()
        t2 = clock() if clock else 0.0
    if losses is not None:
        losses.append(loss.detach())
    del out, loss
    return t1 - t0, t2 - t1


def nonfinite(wl: Workload, loss: torch.Tensor) -> str:
    """Why the last iteration's numbers are not finite ("" when they are): its output, seen through
    ``loss = out.mean()`` (NaN or inf as soon as one element is), or a gradient it left behind."""
    if not bool(torch.isfinite(loss)):
        return f"the output holds NaN or inf (its mean is {float(loss)})"
    grads = [(f"input {i}", x.grad) for i, x in enumerate(wl.inputs)]
    grads += [(f"parameter {name}", p.grad) for name, p in wl.model.named_parameters()]
    for what, grad in grads:
        if grad is not None and not bool(torch.isfinite(grad).all()):
            return f"the gradient of {what} holds NaN or inf"
    return ""


def _checked(measurement: Measurement, problem: str) -> Measurement:
    if problem:
        measurement.status, measurement.error = Status.NONFINITE, problem
    return measurement


def _result(case: Case, **fields) -> Measurement:
    meta = metadata.collect(case.device)
    return Measurement(status=Status.OK, device_name=meta["device_name"], metadata=meta, **fields)


def _timings(samples: list[tuple[float, float]], case: Case) -> dict[str, list[float]]:
    fwd = [f for f, _ in samples]
    bwd = [b for _, b in samples] if case.mode.backward else []
    return {"fwd_times_s": fwd, "bwd_times_s": bwd, "times_s": [f + b for f, b in samples]}


class CpuSteps(iterations.Steps):
    """Live bytes and FLOPs from the profiling iteration, times from ``perf_counter``."""

    def __init__(self, case: Case, budget: Budget):
        self.case, self.budget = case, budget
        self.tracker: LiveBytes | AllocatorBytes | None = None
        self.flops: int | None = None
        self.losses: list[torch.Tensor] = []
        self.problem = ""

    def build(self) -> Workload:
        return build(self.case, "cpu")

    def profile(self, wl: Workload) -> None:
        # No dispatch mode can follow a compiled call (flex): the allocator's own reports, and no
        # FLOPs (the FLOP counter is a mode too).
        compiled = iterations.compiles(self.case)
        self.tracker = AllocatorBytes() if compiled else LiveBytes(limit=self.budget.max_memory_bytes)
        self.tracker.register(wl.model, wl.inputs, wl.kept)
        counter = None if compiled else FlopCounterMode(display=False)
        with counter or contextlib.nullcontext(), self.tracker:
            iteration(wl, self.case)
        self.flops = counter.get_total_flops() if counter else None

    def warm_up(self, wl: Workload) -> None:
        iteration(wl, self.case)

    def timed(self, wl: Workload) -> tuple[float, float]:
        return iteration(wl, self.case, time.perf_counter, self.losses)

    def finish(self, wl: Workload) -> None:
        self.problem = nonfinite(wl, self.losses[-1])


def measure_cpu(case: Case, budget: Budget) -> Measurement:
    check_supported(case, predict=False)
    steps = CpuSteps(case, budget)
    samples = iterations.run(case, steps)
    result = _result(case, peak_bytes=steps.tracker.peak_bytes, baseline_bytes=steps.tracker.baseline_bytes,
                     flops=steps.flops, **_timings(samples, case))
    if steps.compile_s is not None:
        result.extra[col.COMPILE_S] = steps.compile_s
    return _checked(result, steps.problem)


def predict(case: Case, budget: Budget) -> Measurement:
    """Peak bytes of ``case`` without allocating; on CUDA, through the caching allocator (:func:`predict_cuda`).

    One iteration: every iteration of either protocol starts from the same live set, so it has the same peak.
    """
    check_supported(case, predict=True)
    if case.device_kind is DeviceKind.CUDA:
        return predict_cuda(case)
    fake = FakeTensorMode()
    with fake:
        wl = build(case, "cpu")
    tracker = LiveBytes()
    tracker.register(wl.model, wl.inputs, wl.kept)
    with fake, FlopCounterMode(display=False) as flops, tracker:
        iteration(wl, case)
    return _result(case, peak_bytes=tracker.peak_bytes, baseline_bytes=tracker.baseline_bytes,
                   flops=flops.get_total_flops())


def predict_cuda(case: Case, *, empty_cache: bool = True, workspace: tuple[int, ...] = ()) -> Measurement:
    """``measure_cuda``'s three numbers from the fake run's allocations replayed on the simulated allocator.

    The build's and one iteration's storages, in order (the CPU kernels' storages: see
    the README, "Predicting CUDA"), replayed step by step through the protocol's iterations
    (:mod:`topk_bench.measure.simulated`): warm-up, gradients cleared, ``empty_cache``
    (``empty_cache=False``: main before issue 14's change), peaks reset, the timed iterations.
    ``workspace``: the cuBLAS workspaces (not seen by the trace, left out by default).
    """
    if case.protocol != OURS.name:  # the simulation replays our sequence (one build, warm-up, reset)
        raise Unsupported(f"--predict --device cuda simulates the iterations of protocol {OURS.name!r} only, "
                          f"not those of {case.protocol!r} (a build per timed iteration, peaks never reset)")
    fake = FakeTensorMode()
    trace = AllocationTrace()
    # The implementations run on fake CPU tensors but shape their temporaries for CUDA (decode's key tiles).
    with fake, trace, hardware.target("cuda"):
        wl = build(case, "cpu")
    setup = trace.take()
    losses: list[torch.Tensor] = []
    with fake, FlopCounterMode(display=False) as flops, trace, hardware.target("cuda"):
        iteration(wl, case, losses=losses)
    body, loss = trace.take(), trace.serial(losses[0])
    sim = simulate(case, setup, body, loss=loss, empty_cache=empty_cache, workspace=workspace)
    return _result(case, peak_bytes=sim.peak_bytes, reserved_bytes=sim.reserved_bytes,
                   baseline_bytes=sim.baseline_bytes, flops=flops.get_total_flops())


class CudaSteps(iterations.Steps):
    """The caching allocator's peaks over the timed iterations, CUDA events around forward and backward."""

    def __init__(self, case: Case, device: torch.device):
        self.case, self.device = case, device
        self.flops: int | None = None
        self.after_build = self.baseline = self.workspace = self.peak = self.reserved = None
        self.losses: list[torch.Tensor] = []
        self.problem = ""

    def build(self) -> Workload:
        wl = build(self.case, self.device)
        torch.cuda.synchronize(self.device)
        self.after_build = torch.cuda.memory_allocated(self.device)  # parameters and inputs, before any iteration
        return wl

    def profile(self, wl: Workload) -> None:
        with FlopCounterMode(display=False) as flops:  # ours: the first warm-up (cuBLAS workspaces, kernels)
            iteration(wl, self.case)
        self.flops = flops.get_total_flops()

    def warm_up(self, wl: Workload) -> None:
        iteration(wl, self.case)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def start(self, wl: Workload, *, reset_peak: bool) -> None:
        """The baseline is what ``wl``'s build left allocated. With the reset (ours), the warm-up has run:
        what it left besides (cuBLAS workspaces) is ``workspace``, and ``empty_cache`` returns the segments it
        cached so that the reserved peak is the timed region's own."""
        self.baseline = self.after_build
        if reset_peak:
            torch.cuda.synchronize(self.device)
            self.workspace = torch.cuda.memory_allocated(self.device) - self.baseline
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def timed(self, wl: Workload) -> tuple[float, float]:
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        marks = iter((start, mid, end))
        # The "clock" records the next event; durations are read from the events after synchronising.
        iteration(wl, self.case, clock=lambda: next(marks).record() or 0.0, losses=self.losses)
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(mid) / 1e3, mid.elapsed_time(end) / 1e3  # elapsed_time is in ms

    def finish(self, wl: Workload) -> None:
        self.peak = torch.cuda.max_memory_allocated(self.device)
        self.reserved = torch.cuda.max_memory_reserved(self.device)
        self.problem = nonfinite(wl, self.losses[-1])  # after the peaks: the check allocates


def measure_cuda(case: Case, budget: Budget) -> Measurement:
    """The paper's method; under our protocol with its weaknesses fixed (warm-up, peak reset, baseline and
    workspace reported). Under the paper protocol: no warm-up, no reset, no ``empty_cache``, no workspace
    column (the first, cold iteration allocates it inside the measured region, as theirs did).

    - ``baseline_bytes``: allocated right after the build, before any iteration: parameters and inputs,
      as on the CPU and in predictions;
    - ``workspace_bytes`` (a result column): what the warm-up left allocated besides them (cuBLAS and
      cuBLASLt workspaces: 65 MiB on an H100 with torch 2.11), live through every timed iteration, so that
      ``peak_bytes - workspace_bytes`` compares with the CPU's and the predicted peak;
    - ``peak_bytes`` / ``reserved_bytes``: ``max_memory_allocated`` / ``max_memory_reserved`` of the timed
      iterations. ``empty_cache()`` before the reset gives back the segments the warm-up cached and no
      longer uses, so that the reserved peak is the timed region's own, not the warm-up's.

    The memory budget is checked against these peaks afterwards
    (:func:`topk_bench.measure.worker.over_budget`): a failed allocation here means the device ran out.
    """
    check_supported(case, predict=False)
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available on this machine")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(case.device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    # Events record on the current device's current stream: make the case's device current.
    with torch.cuda.device(device):
        steps = CudaSteps(case, device)
        samples = iterations.run(case, steps)
        result = _result(
            case, peak_bytes=steps.peak, reserved_bytes=steps.reserved, baseline_bytes=steps.baseline,
            flops=steps.flops, **_timings(samples, case),
        )
        if steps.workspace is not None:
            result.extra[col.WORKSPACE_BYTES] = steps.workspace
        if steps.compile_s is not None:
            result.extra[col.COMPILE_S] = steps.compile_s
        return _checked(result, steps.problem)


MEASURING: dict[DeviceKind, Callable[[Case, Budget], Measurement]] = {
    DeviceKind.CPU: measure_cpu, DeviceKind.CUDA: measure_cuda,
}


def backend_of(case: Case) -> Callable[[Case, Budget], Measurement]:
    """The backend that measures ``case``: :func:`predict` for a prediction, else its device kind's."""
    return predict if case.predicted else MEASURING[case.device_kind]


def measure(case: Case, budget: Budget | None = None) -> Measurement:
    """Measure (or predict) ``case`` in this process. Raises on failure; no status mapping here."""
    return backend_of(case)(case, budget or Budget())
