"""How busy the machine is: the 1-minute load average per core, the CPU time stolen by a hypervisor, and
the cores other processes keep busy.

Read where a case is measured (the child, or a Slurm job on its node) at the
start and the end of its measurement, as pyperf records ``load_avg_1min`` with
each benchmark; the rule that turns the readings into a flag is
:func:`topk_bench.results.trust.flags`. What a case saw while it ran is
:mod:`topk_bench.measure.contention`'s. Standard library only (no torch): the
parent reads it too, to warn before a run that the machine is already busy, and
to choose ``threads = "auto"`` (:func:`free_cores`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
PROC = Path("/proc")
# How long free_cores watches the machine: long enough for 1% of a core's resolution at 100 jiffies a second.
WATCH_S = 0.5


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


# -- the cores other processes keep busy ---------------------------------------------------------


def _busy_jiffies(cpus: set[int], path: Path = PROC_STAT) -> int | None:
    """Jiffies the CPUs ``cpus`` spent on anything but idling (iowait is idle too) since boot."""
    try:
        with open(path) as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    busy = 0
    for fields in lines:
        if int(fields[0][3:]) in cpus and len(fields) >= 9:
            values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
            busy += sum(values) - values[3] - values[4]
    return busy


def _process_tree_jiffies(root: int) -> int:
    """CPU jiffies of ``root`` and every process descending from it, their reaped children's included."""
    parents: dict[int, int] = {}
    spent: dict[int, int] = {}
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        try:
            with open(PROC / entry / "stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue
        pid = int(entry)
        # state ppid ... utime(12) stime(13) cutime(14) cstime(15), counted from the state field
        parents[pid], spent[pid] = int(fields[1]), sum(int(v) for v in fields[11:15])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(spent.get(pid, 0) for pid in tree)


def others_busy(watch_s: float = WATCH_S, root: int | None = None) -> float | None:
    """Cores of this process's CPUs that other processes kept busy while it watched for ``watch_s``
    seconds (this process and its descendants, e.g. the warm template importing torch, left out);
    None where ``/proc`` does not say."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    root = os.getpid() if root is None else root
    ticks = os.sysconf("SC_CLK_TCK")
    busy, ours, start = _busy_jiffies(cpus), _process_tree_jiffies(root), time.monotonic()
    if busy is None:
        return None
    time.sleep(watch_s)
    busy_end, ours_end, wall = _busy_jiffies(cpus), _process_tree_jiffies(root), time.monotonic() - start
    if busy_end is None or wall <= 0:
        return None
    return max(0.0, (busy_end - busy) - (ours_end - ours)) / ticks / wall


_seen: tuple[float, float | None] | None = None  # (when, others_busy()) of the last look, for busy_now


def busy_now(max_age_s: float = 10.0) -> float | None:
    """:func:`others_busy`, or what it said less than ``max_age_s`` ago (a process planning runs one after
    another, e.g. a notebook or the tests, watches the machine once every so often, not before each)."""
    global _seen
    if _seen is None or time.monotonic() - _seen[0] > max_age_s:
        _seen = (time.monotonic(), others_busy())
    return _seen[1]


def free_cores(busy: float | None) -> int:
    """``threads = "auto"``: the cores this process may use less those others keep busy (at least one)."""
    return max(1, cores() - round(busy or 0.0))
