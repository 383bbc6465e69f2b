"""One case measured (or predicted) in this process, then its extra columns, every failure turned into a status.

:func:`execute` is what a child runs for its case (:mod:`.worker`), and what runs a case in-process; the
backends raise, and :func:`classify` says which status each failure is.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from topk_bench import machine, plugins
from topk_bench.case import Budget, Case, Measurement
from topk_bench.child import as_asked
from topk_bench.errors import NonFinite, Unsupported
from topk_bench.extras.columns import extra_columns
from topk_bench.measure import memory, metadata
from topk_bench.measure.backends import MEASURING
from topk_bench.measure.memory import OverBudget
from topk_bench.predict.backends import predict
from topk_bench.results import columns as col
from topk_bench.status import Status
from topk_bench.types import DeviceKind

# Frames not worth naming in an error: torch internals and the tracker that observes every op.
_INTERNAL = (str(Path(torch.__file__).parent), str(Path(memory.__file__)))


def _where(exc: BaseException) -> str:
    """Innermost frame outside torch and the tracker: where the failing call came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_INTERNAL)]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


# Allocation failures raised as a plain RuntimeError: the CPU allocator, and CUDA libraries whose own
# allocation failed (cuBLAS/cuBLASLt workspaces and handles, cuDNN, cuSOLVER, cuFFT, a raw cudaMalloc).
_ALLOCATION_FAILURE_TEXT = (
    "can't allocate memory",
    "CUDA out of memory",
    "CUDA error: out of memory",
    "_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
)


def _is_allocation_failure(exc: BaseException) -> bool:
    candidates = (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None), MemoryError)
    oom_types = tuple(t for t in candidates if t)
    return isinstance(exc, oom_types) or (
        isinstance(exc, RuntimeError) and any(text in str(exc) for text in _ALLOCATION_FAILURE_TEXT)
    )


def budget_limits_allocations(case: Case | None, budget: Budget) -> bool:
    """Whether the child's allocations are capped by the memory budget itself, so that a failed allocation
    means the case needed more than its budget: a measured CPU case (an address-space limit derived from the
    budget, :func:`limit_address_space`). On CUDA the budget is checked against the measured peaks instead
    (:func:`over_budget`), and a failed allocation means the device ran out."""
    return case is not None and budget.max_memory_bytes is not None and case.measured_on(DeviceKind.CPU)


def classify(exc: BaseException, budget: Budget, case: Case | None = None) -> tuple[Status, str]:
    """(status, one-line message) of a failed ``case``.

    A failed allocation is ``over_budget`` only where the budget itself made it fail
    (:func:`budget_limits_allocations`); anywhere else (a CUDA device, the machine) it is ``oom``.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [""]
    # A first line that only announces the next (torch.compile's "backend='inductor' raised:") takes it along.
    first_line = (f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0])[:400]
    message = f"{type(exc).__name__}: {first_line}{_where(exc)}"
    if isinstance(exc, OverBudget):
        return Status.OVER_BUDGET, first_line
    if isinstance(exc, Unsupported):
        return Status.UNSUPPORTED, first_line
    if isinstance(exc, NotImplementedError):  # what this torch (or an implementation on it) cannot do
        return Status.UNSUPPORTED, message
    if isinstance(exc, NonFinite):  # a NaN in an optional column (extras)
        return Status.NONFINITE, first_line
    if _is_allocation_failure(exc):
        return (Status.OVER_BUDGET if budget_limits_allocations(case, budget) else Status.OOM), message
    return Status.ERROR, message


def over_budget(result: Measurement, budget: Budget) -> str:
    """Why a measured ``result`` is over its memory budget ("" when it is not): the largest of its peaks,
    allocated and, where there is one (CUDA), reserved (what the process took from the device; the paper's
    figures drop points whose reserved peak passes 30 GiB)."""
    limit = budget.max_memory_bytes
    if limit is None:
        return ""
    peaks = [
        (name, value)
        for name, value in (("peak", result.peak_bytes), ("reserved peak", result.reserved_bytes))
        if value is not None and value > limit
    ]
    if not peaks:
        return ""
    name, value = max(peaks, key=lambda item: item[1])
    return f"{name} {value} bytes exceeds the memory budget of {limit} bytes"


def backend_of(case: Case) -> Callable[[Case, Budget], Measurement]:
    """The backend that measures ``case``: :func:`predict` for a prediction, else its device kind's."""
    return predict if case.predicted else MEASURING[case.device_kind]


def measure(case: Case, budget: Budget | None = None) -> Measurement:
    """Measure (or predict) ``case`` in this process. Raises on failure; no status mapping here."""
    return backend_of(case)(case, budget or Budget())


def _measuring(case: Case):
    """How ``case`` is measured: by its backend, or, with a profile directory, by the profile's capture (which
    measures the same way and writes the profile; imported only then: torch.profiler is not every case's)."""
    if case.profile:
        from topk_bench.capture.capture import measure as measure_and_profile

        return measure_and_profile
    return measure


def execute(case: Case, budget: Budget | None = None) -> Measurement:
    """Measure ``case`` in this process, then its optional columns; never raises for a failing case.

    The time budget is not enforced here: the caller's process supervisor
    (the launcher, or Slurm's time limit) kills the process.
    """
    budget = budget or Budget()
    start = machine.read()  # the machine's load around the measurement: the row's trust flag
    try:
        plugins.load(case.plugins)
        result = _measuring(case)(case, budget)
        result.metadata.update(machine.context(start, machine.read()))
        # Outside the measured region: fidelity against vanilla, a workload's own columns.
        if result.status == Status.OK:  # not for a nonfinite case (its error metrics would be NaN)
            result.extra.update(extra_columns(case, budget))
    except Exception as exc:  # noqa: BLE001 -- every failure becomes a status
        status, message = classify(exc, budget, case)
        meta = metadata.collect(case.device)
        result = Measurement(
            status=status,
            error=message,
            peak_bytes=getattr(exc, "live_bytes", None),
            device_name=meta["device_name"],
            metadata={**meta, **machine.context(start, machine.read())},
        )
    problem = over_budget(result, budget) if result.status == Status.OK else ""
    if problem:
        result.status, result.error = Status.OVER_BUDGET, problem
    # Which code ran where the machine decides it: after the case, so that a first build is not in its time.
    result.metadata[col.CODE_PATH] = metadata.code_path(case.impl, case.ff_impl, case.device, case.dtype.to_torch())
    return as_asked.judged(case, result)
