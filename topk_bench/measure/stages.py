"""Per-stage cost: the time and the peak of each stage an implementation marks (:mod:`attention.shared.stages`).

A :class:`StageMeter` listens to the marks (``attention.shared.stages.listening``) and keys each stage
``forward.<name>`` or ``backward.<name>`` (backward: entered while autograd runs a backward node). It sums each
stage's seconds over its entries (a chunked loop enters a stage once per chunk), by a clock read at each
boundary, and keeps the highest live bytes seen inside it, from a :class:`Peaks` source: the live-bytes tracker
of the profiling iteration (CPU, ``--predict``) or the CUDA allocator's peak. Nested stages are inclusive.

Where the measurement takes them (docs/CONTRACTS.md, "Per-stage cost"): peaks in the profiling iteration, whose
tracker sees every allocation; times in one extra iteration after the timed ones, untracked (a tracker's per-op
cost would inflate them), so that no timed sample pays for a listener.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from topk_bench import attention
from topk_bench.attention.shared import stages as marks
from topk_bench.case import Case
from topk_bench.measure.iterations import compiles
from topk_bench.measure.memory import LiveBytes
from topk_bench.results.stage_cells import cells as columns

__all__ = ["StageMeter", "TrackerPeaks", "CudaPeaks", "columns", "marks_stages", "peaks_of", "timed_stages"]


class Peaks(Protocol):
    """Where a stage's peak is read: ``start`` as a stage is entered, ``read`` the highest live bytes since the
    innermost open ``start``, ``stop`` as it is left."""

    def start(self) -> None: ...

    def read(self) -> int: ...

    def stop(self) -> None: ...


class TrackerPeaks:
    """A high-water mark of a :class:`~topk_bench.measure.memory.LiveBytes` per open stage (its ``peak_bytes``, and
    a profile's attribution of the peak, untouched)."""

    def __init__(self, tracker: LiveBytes):
        self.tracker = tracker

    def start(self) -> None:
        self.tracker.watermarks.append(self.tracker.current_bytes)

    def read(self) -> int:
        return self.tracker.watermarks[-1]

    def stop(self) -> None:
        self.tracker.watermarks.pop()


class CudaPeaks:
    """``max_memory_allocated`` of a device, reset as each stage is entered (in the profiling warm-up iteration,
    before the measured region's own reset: the row's peak is not this iteration's)."""

    def __init__(self, device: torch.device, cuda=torch.cuda):
        self.device, self.cuda = device, cuda

    def start(self) -> None:
        self.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> int:
        return int(self.cuda.max_memory_allocated(self.device))

    def stop(self) -> None:
        """Nothing: the enclosing stage already holds what it saw before this one's reset."""


@dataclass
class _Open:
    key: str
    start: float
    seen: int = 0  # the highest live bytes seen inside, as far as read (a nested stage's included)


class StageMeter:
    """A stage listener: seconds (``clock``) and peaks (``peaks``) per ``forward.<stage>`` / ``backward.<stage>``."""

    def __init__(self, *, clock: Callable[[], float] | None = None, peaks: Peaks | None = None):
        self.clock, self.peaks = clock, peaks
        self.times: dict[str, float] = {}
        self.peak_bytes: dict[str, int] = {}
        self._open: list[_Open] = []

    def __call__(self, name: str, entering: bool) -> None:
        if entering:
            key = f"{'backward' if marks.in_backward() else 'forward'}.{name}"
            if self.peaks is not None:
                if self._open:  # what the enclosing stage saw so far, before a reset could hide it
                    self._open[-1].seen = max(self._open[-1].seen, self.peaks.read())
                self.peaks.start()
            self._open.append(_Open(key, self.clock() if self.clock else 0.0))
            return
        done = self._open.pop()
        if self.clock is not None:
            self.times[done.key] = self.times.get(done.key, 0.0) + (self.clock() - done.start)
        if self.peaks is not None:
            inside = max(done.seen, self.peaks.read())
            self.peaks.stop()
            self.peak_bytes[done.key] = max(self.peak_bytes.get(done.key, 0), inside)
            if self._open:
                self._open[-1].seen = max(self._open[-1].seen, inside)

    @contextlib.contextmanager
    def listening(self) -> Iterator[StageMeter]:
        with marks.listening(self):
            yield self


def marks_stages(case: Case) -> bool:
    """Whether the case's stages are measured: its implementation declares stages (registry ``stages``) and runs
    eagerly (a compiled call fuses across the marks: its stages are not what ran)."""
    if case.impl not in attention.names() or not attention.spec(case.impl).stages:
        return False
    return not compiles(case)


def peaks_of(case: Case, tracker: LiveBytes):
    """A context in which ``tracker``'s iteration also records each stage's peak (a meter; None: no stages)."""
    if not marks_stages(case):
        return contextlib.nullcontext(None)
    return StageMeter(peaks=TrackerPeaks(tracker)).listening()


def timed_stages(run: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per stage of one call of ``run`` (one iteration), by ``clock`` at each stage boundary."""
    meter = StageMeter(clock=clock)
    with meter.listening():
        run()
    return meter.times
