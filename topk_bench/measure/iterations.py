"""The iteration structure of a measured case, per protocol: the one place that says which iterations run,
on which model and inputs, which are timed, and where the measured region starts.

A backend says how each step is done on its device (:class:`Steps`); :func:`run` decides which steps
run, and in what order:

- ``ours``: one workload, built once. For an implementation that compiles on its first call (flex), that
  call comes first, untimed, its seconds kept (``compile_s``). Its first iteration profiles (FLOPs; on the CPU, live bytes) and
  warms up, ``warmup - 1`` more warm up; the measured region starts (peaks restart); ``repeats``
  timed iterations on the same workload.
- ``paper``, the authors' loop: ``repeats`` (3) timed iterations, each on a model and inputs built just
  before it, outside the timed region, and released before the next is built. No warm-up: the first
  timed iteration is cold. Peaks are never reset, and are read after the last timed iteration. The
  profiling iteration runs after that, on a fresh workload, so that it warms up nothing.

Every iteration of a case starts from the same live set (parameters, inputs, kept tensors) and ends
with everything else freed, so the live-bytes peak of the profiling iteration is the peak of every
timed one, in either protocol.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

import implementations

from topk_bench.case import Case
from topk_bench.measure.contention import Sampler
from topk_bench.protocol import OURS, PAPER
from topk_bench.workloads import Workload

Sample = tuple[float, float]  # (forward, backward) seconds of one timed iteration


class Steps:
    """How a backend does each step on its device (``start`` and ``finish`` do nothing unless overridden)."""

    # Seconds of the first call of an implementation that compiles (ours), compilation included; else None.
    compile_s: float | None = None
    # What the case's threads got of the machine around each timed iteration (set by :func:`run`).
    contention: Sampler

    def build(self) -> Workload:
        raise NotImplementedError

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA); nothing on the CPU."""

    def profile(self, wl: Workload) -> None:
        """One untimed iteration that counts FLOPs (on the CPU, also live bytes)."""
        raise NotImplementedError

    def warm_up(self, wl: Workload) -> None:
        """One untimed iteration."""
        raise NotImplementedError

    def start(self, wl: Workload, *, reset_peak: bool) -> None:
        """The measured region starts, on ``wl``: what is live now is the baseline; peaks restart if asked."""

    def timed(self, wl: Workload) -> Sample:
        raise NotImplementedError

    def finish(self, wl: Workload) -> None:
        """The timed iterations are over, the last on ``wl``: read the peaks, then check its numbers."""


def _timed(steps: Steps, wl: Workload) -> Sample:
    """One timed iteration, the case's contention read around it (:mod:`topk_bench.measure.contention`)."""
    with steps.contention.around():
        return steps.timed(wl)


def compiles(case: Case) -> bool:
    """Whether the case's implementation compiles on its first call (registry ``compiles``: flex)."""
    return case.impl in implementations.names() and implementations.spec(case.impl).compiles


def _ours(case: Case, steps: Steps) -> list[Sample]:
    wl = steps.build()
    if compiles(case):  # its first call compiles: a warm-up of its own, whose seconds are compile_s
        start = time.perf_counter()
        steps.warm_up(wl)
        steps.sync()
        steps.compile_s = time.perf_counter() - start
    steps.profile(wl)
    for _ in range(case.warmup - 1):
        steps.warm_up(wl)
    wl.clear_grads()
    steps.start(wl, reset_peak=True)
    samples = [_timed(steps, wl) for _ in range(case.repeats)]
    steps.finish(wl)
    return samples


def _paper(case: Case, steps: Steps) -> list[Sample]:
    samples, wl = [], None
    for i in range(case.repeats):
        wl = None  # the last one freed before the next is built, as their `del Q, model, out, loss`
        wl = steps.build()  # outside the timed region, as their get_inputs()
        if i == 0:
            steps.start(wl, reset_peak=False)
        samples.append(_timed(steps, wl))
    steps.finish(wl)
    wl = None
    steps.profile(steps.build())
    return samples


STRUCTURES: dict[str, Callable[[Case, Steps], list[Sample]]] = {OURS.name: _ours, PAPER.name: _paper}


def run(case: Case, steps: Steps) -> list[Sample]:
    """Run ``case``'s iterations in its protocol's structure; the samples of the timed ones."""
    try:
        structure = STRUCTURES[case.protocol]
    except KeyError:
        raise ValueError(f"unknown protocol {case.protocol!r} (known: {', '.join(STRUCTURES)})") from None
    steps.contention = Sampler(torch.get_num_threads())
    return structure(case, steps)
