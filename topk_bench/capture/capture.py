"""A case measured (or predicted) as its backend measures it, and profiled on the way: the child's side.

:func:`measure` is :func:`topk_bench.child.execute.measure` for a case with a ``profile`` directory
(:mod:`topk_bench.child.worker` calls it): the same iterations and the same numbers, with the
tracker of the peak's iteration swapped for :class:`~.attribution.Attribution`, and, where the case
is measured, one more iteration under ``torch.profiler`` after the timed ones. It writes the
profile (:mod:`.files`) and returns the measurement.

- predicted on the CPU: the fake run, attributed; its peak is the row's.
- measured on the CPU: the profiling iteration (the first warm-up) attributed; its peak is the row's.
- predicted for CUDA: the fake run attributed, replayed on the simulated caching allocator, which says
  which blocks hold its peak (:mod:`.simulated`).
- measured on CUDA: the allocator's own history of the measured region (:mod:`.cuda_snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from topk_bench.capture import files, timing
from topk_bench.capture import sources as src
from topk_bench.capture.allocator import AllocatorRows
from topk_bench.capture.attribution import Attribution, Phase
from topk_bench.capture.cuda_snapshot import SnapshotCudaSteps, peak_rows
from topk_bench.capture.rows import Row
from topk_bench.capture.simulated import KernelAttribution, PeakSimulation
from topk_bench.case import Budget, Case, Measurement
from topk_bench.measure import backends
from topk_bench.measure.steps import iteration
from topk_bench.predict.allocator import FREE
from topk_bench.predict.backends import predict
from topk_bench.protocol import OURS
from topk_bench.types import DeviceKind


@dataclass
class Captured:
    """What a profiled case gives besides its measurement."""

    rows: list[Row]
    attribution: Attribution | None  # the attributed iteration (its timeline)
    timing: timing.Timing | None = None  # measured cases: one iteration under torch.profiler
    snapshot: dict | None = None  # measured on CUDA: the allocator's history
    notes: list[str] = field(default_factory=list)


def _predicted_cpu(case: Case, budget: Budget, sources: src.Sources) -> tuple[Measurement, Captured]:
    tracker = Attribution(sources)
    result = predict(case, budget, tracker=tracker)
    return result, Captured(tracker.rows(), tracker)


def _predicted_cuda(case: Case, budget: Budget, sources: src.Sources) -> tuple[Measurement, Captured]:
    """:func:`~topk_bench.predict.backends.predict` itself (its ``predict_cuda``), the trace attributed and the
    simulation keeping its
    peak's blocks."""
    traces: list[KernelAttribution] = []
    simulations: list[PeakSimulation] = []

    def trace(gpu, adds) -> KernelAttribution:
        traces.append(KernelAttribution(sources, gpu, adds))
        return traces[-1]

    def steps(*args, **options) -> PeakSimulation:
        simulations.append(PeakSimulation(*args, **options))
        return simulations[-1]

    result = predict(case, budget, make_trace=trace, make_steps=steps)
    tracker, simulation = traces[-1], simulations[-1]
    for serial, nbytes in simulation.setup:  # what the build made is the baseline
        if nbytes != FREE and serial in tracker.storages:
            tracker.storages[serial].phase = Phase.BASELINE
    return result, Captured(simulation.rows(tracker), tracker)


class _ProfiledCpuSteps(backends.CpuSteps):
    """The CPU measurement with its profiling iteration attributed and one more iteration under the profiler."""

    def __init__(self, case: Case, budget: Budget, sources: src.Sources):
        super().__init__(case, budget)
        self.sources = sources
        self.timing: timing.Timing | None = None

    def live_bytes(self) -> Attribution:
        return Attribution(self.sources, limit=self.budget.max_memory_bytes)

    def allocator_bytes(self) -> AllocatorRows:
        return AllocatorRows(self.sources)

    def finish(self, wl) -> None:
        super().finish(wl)
        self.timing = timing.profile_iteration(lambda: iteration(wl, self.case), cuda=False)


def _measured_cpu(case: Case, budget: Budget, sources: src.Sources) -> tuple[Measurement, Captured]:
    made: list[_ProfiledCpuSteps] = []

    def steps(c: Case, b: Budget) -> _ProfiledCpuSteps:
        made.append(_ProfiledCpuSteps(c, b, sources))
        return made[-1]

    result = backends.measure_cpu(case, budget, make_steps=steps)
    tracker = made[0].tracker
    if isinstance(tracker, AllocatorRows):  # a compiled call (flex): the profiler's allocations, no timeline
        return result, Captured(tracker.rows, None, made[0].timing, notes=tracker.notes)
    assert isinstance(tracker, Attribution), "what _ProfiledCpuSteps.live_bytes makes"
    return result, Captured(tracker.rows(), tracker, made[0].timing)


def _measured_cuda(case: Case, budget: Budget, sources: src.Sources) -> tuple[Measurement, Captured]:
    made: list[SnapshotCudaSteps] = []

    def steps(c: Case, device: torch.device, cuda) -> SnapshotCudaSteps:
        made.append(SnapshotCudaSteps(c, device, sources, cuda))
        return made[-1]

    result = backends.measure_cuda(case, budget, make_steps=steps)
    done = made[0]
    assert done.region is not None, "set when the timed iterations finish"
    rows, peak, baseline, notes = peak_rows(
        done.trace(),
        builds=done.builds,
        region=done.region,
        empty_cache=case.protocol == OURS.name,
        attribution=done.attribution,
        sources=sources,
    )
    if (peak.bytes, baseline) != (result.peak_bytes, result.baseline_bytes):
        notes.append(
            f"the allocator's history gives a peak of {peak.bytes} over {baseline} bytes; "
            f"max_memory_allocated {result.peak_bytes} over {result.baseline_bytes}"
        )
    return result, Captured(rows, done.attribution, done.timing, done.snapshot, notes)


def measure(case: Case, budget: Budget) -> Measurement:
    """Measure (or predict) ``case`` as :func:`topk_bench.child.execute.measure` does, and write its profile to
    ``case.profile``; a profile that cannot be written is said in the row's ``error``, its status unchanged."""
    sources = src.Sources(src.user_files((case.impl, case.ff_impl or ""), case.plugins))
    if case.predicted:
        how = _predicted_cuda if case.device_kind is DeviceKind.CUDA else _predicted_cpu
    else:
        how = _measured_cuda if case.device_kind is DeviceKind.CUDA else _measured_cpu
    result, captured = how(case, budget, sources)
    try:
        files.write(Path(case.profile), case, result, captured)
    except OSError as exc:  # the measurement stands: a profile never changes a row, its error says what is missing
        note = f"profile not written to {case.profile}: {exc.strerror or exc}"
        result.error = f"{result.error}; {note}" if result.error else note
    return result
