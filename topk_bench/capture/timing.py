"""Where the time goes: one iteration under ``torch.profiler``, as ``ops.csv`` and a Chrome / Perfetto trace.

The iteration profiled is an extra one, after the timed iterations and on the same workload, so that
the profiler's own cost never reaches the case's times. Per op (``key_averages``): calls, self and
total host time, and on CUDA self and total device time, and FLOPs where the profiler counts them
(matrix products, convolutions). The counts per iteration: aten ops (every call, nested ones included,
as the dispatcher sees them) and, on CUDA, kernel launches (the runtime's launch calls).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from topk_bench import fileio

# CUDA runtime and driver calls that launch a kernel.
LAUNCHES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
    "cudaGraphLaunch",
)
OPS_COLUMNS = ("op", "calls", "self_host_s", "total_host_s", "self_device_s", "total_device_s", "flops")


@dataclass
class Timing:
    """One profiled iteration: its ops' table, its counts, and the profile for the trace."""

    ops: list[dict]  # one per op name, OPS_COLUMNS, largest self time first
    aten_ops: int  # aten op calls in the iteration, nested ones included
    kernel_launches: int | None  # CUDA: kernel launches; None on the CPU
    profile: torch.profiler.profile

    def ops_csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=OPS_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.ops)
        return out.getvalue()

    def write(self, directory: Path) -> None:
        fileio.write_atomic(directory / "ops.csv", self.ops_csv().encode())
        partial = directory / "trace.json.partial"
        self.profile.export_chrome_trace(str(partial))
        partial.replace(directory / "trace.json")


def _seconds(microseconds: float) -> float:
    return round(microseconds / 1e6, 9)


def _table(profile: torch.profiler.profile, cuda: bool) -> list[dict]:
    rows = []
    for avg in profile.key_averages():
        rows.append(
            {
                "op": avg.key,
                "calls": avg.count,
                "self_host_s": _seconds(avg.self_cpu_time_total),
                "total_host_s": _seconds(avg.cpu_time_total),
                "self_device_s": _seconds(avg.self_device_time_total) if cuda else "",
                "total_device_s": _seconds(avg.device_time_total) if cuda else "",
                "flops": avg.flops or "",
            }
        )
    key = "self_device_s" if cuda else "self_host_s"
    return sorted(rows, key=lambda r: (-(r[key] or 0.0), r["op"]))


def profile_iteration(run: Callable[[], object], *, cuda: bool) -> Timing:
    """Run ``run`` (one iteration) under ``torch.profiler``; on CUDA, device activity too."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities, with_flops=True) as profile:
        run()
        if cuda:
            torch.cuda.synchronize()
    events = profile.events()
    aten = sum(1 for e in events if e.name.startswith("aten::"))
    launches = sum(1 for e in events if e.name in LAUNCHES) if cuda else None
    return Timing(ops=_table(profile, cuda), aten_ops=aten, kernel_launches=launches, profile=profile)
