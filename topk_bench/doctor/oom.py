"""Allocation failures, through the real child process (``run_isolated``), become the statuses ``run`` records.

- past the device: an allocation larger than the device can hold (CUDA: twice its memory;
  CPU: 4 EiB, past any address space) with no memory budget is ``oom``;
- past the budget: a case whose peak exceeds its memory budget is ``over_budget`` (CPU: the
  live-bytes tracker stops it; CUDA: the measured peak is judged after the case).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from topk_bench.case import Budget
from topk_bench.doctor import tiny
from topk_bench.doctor.check import Check, brief
from topk_bench.doctor.probes import MODULE
from topk_bench.status import Status
from topk_bench.types import DeviceKind
from topk_bench.units import MIB

BUDGET = 64 * MIB


def _device_bytes(device: str) -> int:
    if DeviceKind.of(device) is DeviceKind.CUDA:
        import torch

        return 2 * torch.cuda.get_device_properties(torch.device(device)).total_memory
    return 1 << 62


def _run(device: str, nbytes: int, budget: Budget):
    from topk_bench.run.launcher import run_isolated

    case = tiny.case("doctor_allocate", device=device, option_overrides={"nbytes": nbytes}, plugins=(MODULE,))
    return run_isolated(case, budget)


def _judge(name: str, expected: Status, result, what: str) -> Check:
    detail = f"{what}: status {result.status}" + (f" ({brief(result.error, 140)})" if result.error else "")
    return Check.judged(
        name, result.status == expected, detail + ("" if result.status == expected else f"; expected {expected}")
    )


def start(device: str) -> Callable[[], list[Check]]:
    """Starts both children at once (each spends seconds importing torch while the caller goes on);
    the returned function waits for them and judges."""
    past_device = _device_bytes(device)
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="doctor-oom")
    oom = pool.submit(_run, device, past_device, Budget())
    over = pool.submit(_run, device, 2 * BUDGET, Budget(max_memory_bytes=BUDGET))
    pool.shutdown(wait=False)

    def finish() -> list[Check]:
        return [
            _judge("oom: past the device", Status.OOM, oom.result(), f"{past_device:,} B in a child, no budget"),
            _judge(
                "oom: past the budget",
                Status.OVER_BUDGET,
                over.result(),
                f"{2 * BUDGET:,} B in a child, budget {BUDGET:,} B",
            ),
        ]

    return finish


def checks(device: str) -> list[Check]:
    return start(device)()
