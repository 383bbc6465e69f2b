"""Per-stage cost: the time and the peak of each stage an implementation marks (:mod:`implementations.stages`).

A :class:`StageMeter` listens to the marks (``implementations.stages.listening``) and keys each stage
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
from typing import Protocol

import torch

import implementations
from implementations import stages as marks
from topk_bench.case import Case
from topk_bench.measure.memory import LiveBytes
from topk_bench.results.stage_cells import cells as columns

__all__ = ["StageMeter", "TrackerPeaks", "CudaPeaks", "columns", "marks_stages", "peaks_of", "timed_stages"]


class Peaks(Protocol):
    """Where a stage's peak is read: the highest live bytes since the last ``reset``."""

    def peak(self) -> int: ...

    def reset(self) -> None:
        """The peak restarts from what is live now."""

    def restore(self, peak: int) -> None:
        """The peak is at least ``peak`` again (the enclosing region's, which a stage's reset hid)."""


class TrackerPeaks:
    """The peaks of a :class:`~topk_bench.measure.memory.LiveBytes` (its own peak left as if never reset)."""

    def __init__(self, tracker: LiveBytes):
        self.tracker = tracker

    def peak(self) -> int:
        return self.tracker.peak_bytes

    def reset(self) -> None:
        self.tracker.reset_peak()

    def restore(self, peak: int) -> None:
        self.tracker.peak_bytes = max(self.tracker.peak_bytes, peak)


class CudaPeaks:
    """``max_memory_allocated`` of a device, reset at each stage's entry (in an iteration before the measured
    region's own reset: its peak is not the row's)."""

    def __init__(self, device: torch.device, cuda=torch.cuda):
        self.device, self.cuda = device, cuda

    def peak(self) -> int:
        return int(self.cuda.max_memory_allocated(self.device))

    def reset(self) -> None:
        self.cuda.reset_peak_memory_stats(self.device)

    def restore(self, peak: int) -> None:
        """The allocator's peak cannot be raised again; nothing reads it before the measured region's reset."""


class StageMeter:
    """A stage listener: seconds (``clock``) and peaks (``peaks``) per ``forward.<stage>`` / ``backward.<stage>``."""

    def __init__(self, *, clock: Callable[[], float] | None = None, peaks: Peaks | None = None):
        self.clock, self.peaks = clock, peaks
        self.times: dict[str, float] = {}
        self.peak_bytes: dict[str, int] = {}
        self._open: list[tuple[str, float, int]] = []  # (key, start time, enclosing peak)

    def __call__(self, name: str, entering: bool) -> None:
        if entering:
            key = f"{'backward' if marks.in_backward() else 'forward'}.{name}"
            enclosing = 0
            if self.peaks is not None:
                enclosing = self.peaks.peak()
                self.peaks.reset()
            self._open.append((key, self.clock() if self.clock else 0.0, enclosing))
            return
        key, start, enclosing = self._open.pop()
        if self.clock is not None:
            self.times[key] = self.times.get(key, 0.0) + (self.clock() - start)
        if self.peaks is not None:
            inside = self.peaks.peak()
            self.peak_bytes[key] = max(self.peak_bytes.get(key, 0), inside)
            self.peaks.restore(max(enclosing, inside))

    @contextlib.contextmanager
    def listening(self) -> Iterator[StageMeter]:
        with marks.listening(self):
            yield self


def marks_stages(case: Case) -> bool:
    """Whether the case's implementation declares stages (registry ``stages``)."""
    return case.impl in implementations.names() and bool(implementations.spec(case.impl).stages)


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
