"""How busy the machine is: the 1-minute load average per core, and the CPU time stolen by a hypervisor.

Read where a case is measured (the child, or a Slurm job on its node) at the
start and the end of its measurement, as pyperf records ``load_avg_1min`` with
each benchmark; the rule that turns the readings into a flag is
:func:`topk_bench.results.trust.flags`. Standard library only (no torch): the
parent reads it too, to warn before a run that the machine is already busy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def cores() -> int:
    """The cores this process may run on (the affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_per_core() -> float | None:
    """The 1-minute load average over the cores; None where the platform has none."""
    try:
        return os.getloadavg()[0] / cores()
    except (AttributeError, OSError):
        return None


def _cpu_times(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot from ``/proc/stat``; None where there is none (not Linux)."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    try:
        # user nice system idle iowait irq softirq steal [guest guest_nice: already counted in user and nice]
        values = [int(v) for v in fields[1:9]]
    except ValueError:
        return None
    return values[7], sum(values)


@dataclass(frozen=True)
class Reading:
    """One look at the machine: load per core, and the CPU counters a later reading subtracts from."""

    load: float | None
    cpu: tuple[int, int] | None


def read() -> Reading:
    return Reading(load_per_core(), _cpu_times())


def steal_share(start: Reading, end: Reading) -> float | None:
    """The share of the machine's CPU time stolen by the hypervisor between two readings; None where unknown."""
    if start.cpu is None or end.cpu is None:
        return None
    total = end.cpu[1] - start.cpu[1]
    if total <= 0:
        return None
    return max(0, end.cpu[0] - start.cpu[0]) / total


def context(start: Reading, end: Reading) -> dict[str, float | None]:
    """The row's machine columns of a case measured between two readings (docs/CONTRACTS.md, "Results CSV")."""
    return {"load_start": start.load, "load_end": end.load, "steal": steal_share(start, end)}
