"""Contention seen from inside a case: what its threads got of the machine while its timed iterations ran.

The load average is read at a case's ends and lags by a minute; a case can be slowed many times over
by a competing process that the load average never shows. So the child looks at itself,
around each timed iteration (:func:`topk_bench.measure.iterations.run` calls :meth:`Sampler.around`):

- wall time (``perf_counter``), and the process's CPU time and involuntary context switches
  (``getrusage(RUSAGE_SELF)``: every thread of the process, OpenMP's included);
- per thread, the time it was runnable but waited for a CPU (Linux ``/proc/self/task/*/schedstat``,
  its second field: the scheduler's run delay; absent where the kernel has no ``CONFIG_SCHED_INFO``);
- the machine's runnable threads (``/proc/loadavg``'s running count, ours included), after each iteration.

:meth:`Sampler.summary` turns the readings into the row's context columns (``threads``, ``cpu_wait``,
``cpu_share``, ``preempt_per_s``, ``runnable``); the rule that flags a row is
:func:`topk_bench.results.trust.flags`. Standard library only (no torch). The readings happen outside each timed
region (before its clock starts, after it stops), so they cost the case's wall time, not its samples.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from topk_bench.machine import cores
from topk_bench.results import columns as col

TASKS = Path("/proc/self/task")
LOADAVG = Path("/proc/loadavg")


def thread_waits(tasks: Path = TASKS) -> dict[str, int] | None:
    """Nanoseconds each thread of this process has spent runnable but waiting for a CPU (schedstat's run
    delay), by thread id; None where the kernel does not say."""
    waits = {}
    try:
        names = os.listdir(tasks)
    except OSError:
        return None
    for name in names:
        try:
            with open(tasks / name / "schedstat") as f:
                waits[name] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile; none readable: the kernel has no schedstat
    return waits or None


def procs_running(path: Path = LOADAVG) -> int | None:
    """Threads runnable on the machine now (running or waiting for a CPU, this one included: the fourth
    field of ``/proc/loadavg``, ``running/total``, as ``procs_running`` of ``/proc/stat``); None elsewhere."""
    try:
        with open(path) as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Reading:
    """One look at this process: wall and CPU seconds, involuntary switches, each thread's waiting."""

    wall: float
    cpu: float
    preempted: int
    waits: dict[str, int] | None

    @classmethod
    def now(cls) -> Reading:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        waits = thread_waits()
        return cls(time.perf_counter(), usage.ru_utime + usage.ru_stime, usage.ru_nivcsw, waits)


class Sampler:
    """The readings around a case's timed iterations; ``threads``: the intra-op threads it runs with."""

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self.waits: list[float] | None = []  # per iteration: the largest share of it one thread waited
        self.shares: list[float] = []  # per iteration: CPU time over threads x wall
        self.wall = 0.0
        self.preempted = 0
        self.runnable: list[int] = []

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        """Read before and after one timed iteration (outside its clock)."""
        start = Reading.now()
        yield
        end = Reading.now()
        wall = end.wall - start.wall
        if wall <= 0:
            return
        self.wall += wall
        self.preempted += end.preempted - start.preempted
        self.shares.append((end.cpu - start.cpu) / (self.threads * wall))
        if self.waits is not None and start.waits is not None and end.waits is not None:
            # A parallel region ends with its slowest thread: the one that waited longest says how much
            # the iteration lost. A thread born during the iteration waited from 0.
            longest = max(ns - start.waits.get(tid, 0) for tid, ns in end.waits.items())
            self.waits.append(max(0, longest) / 1e9 / wall)
        else:
            self.waits = None
        running = procs_running()
        if running is not None:
            self.runnable.append(running)

    def summary(self) -> dict[str, float | int | None]:
        """The context columns (docs/CONTRACTS.md, "Results CSV"): medians over the timed iterations, so that
        one iteration interrupted by a passing process flags nothing; None where nothing was read."""
        return {
            col.THREADS: self.threads,
            col.CPU_WAIT: statistics.median(self.waits) if self.waits else None,
            col.CPU_SHARE: statistics.median(self.shares) if self.shares else None,
            col.PREEMPT_PER_S: self.preempted / self.wall if self.wall > 0 else None,
            col.RUNNABLE: statistics.median(self.runnable) / cores() if self.runnable else None,
        }
