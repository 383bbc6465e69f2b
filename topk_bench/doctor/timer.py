"""The backend's timer measures the work: positive, finite, repeatable, and growing with the work.

The probe does ``n`` sequential matmuls, then ``4 n``. Each time is a median of
:data:`REPEATS` samples. A timer that stops before the work ends (CUDA without a
synchronisation) would show the same time for both: the longer run must take at least
:data:`MIN_GROWTH` times as long. Samples of one size must be within :data:`SPREAD` of
each other (a shared, loaded machine still passes; a broken clock does not).
"""

from __future__ import annotations

import math
import statistics

from topk_bench.case import Budget
from topk_bench.child.execute import measure
from topk_bench.doctor import probes, tiny
from topk_bench.doctor.check import Check
from topk_bench.types import DeviceKind

REPEATS = 5
MATMULS = 8
# The matrices' size per device: on a GPU, 256 x 256 products take microseconds, less than dispatching them,
# so 4x the work could take less than 1.5x the time; 2048 x 2048 in float32 takes ~0.3 ms on an H100.
SIZE = {"cpu": 256, "cuda": 2048}
SPREAD = 10.0
MIN_GROWTH = 1.5


def _times(device: str, matmuls: int) -> list[float]:
    size = SIZE[str(DeviceKind.of(device))]
    case = tiny.case(
        "doctor_work",
        device=device,
        option_overrides={"matmuls": matmuls, "size": size},
        plugins=(probes.MODULE,),
        repeats=REPEATS,
    )
    result = measure(case, Budget())
    return list(result.times_s)


def check(device: str) -> Check:
    short, long = _times(device, MATMULS), _times(device, 4 * MATMULS)
    problems = []
    for name, samples in (("short", short), ("long", long)):
        if not samples or not all(math.isfinite(t) and t > 0 for t in samples):
            problems.append(f"{name}: a sample is not a positive finite number ({samples})")
        elif max(samples) > SPREAD * min(samples):
            problems.append(f"{name}: samples spread over more than {SPREAD:g}x")
    growth = statistics.median(long) / statistics.median(short) if short and long and min(short) > 0 else 0.0
    if growth < MIN_GROWTH:
        problems.append(f"4x the work took {growth:.2f}x the time (< {MIN_GROWTH:g}x)")
    size = SIZE[str(DeviceKind.of(device))]
    detail = (
        f"median {statistics.median(short) * 1e3:.3g} ms for {MATMULS} matmuls of {size}x{size}, "
        f"{statistics.median(long) * 1e3:.3g} ms for {4 * MATMULS} ({growth:.1f}x)"
    )
    return Check.judged("timer", not problems, "; ".join([detail, *problems]))
