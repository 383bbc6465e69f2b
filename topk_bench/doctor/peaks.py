"""Measured peak bytes against the prediction (``--predict``), per predictable implementation.

- CPU: the live-bytes tracker of a measured iteration and the same tracker under
  FakeTensorMode must agree exactly, peak and baseline (measured in this process: the
  tracker counts only the case's tensors).
- CUDA: each case is measured in its own child process (a fresh caching allocator), as
  ``run`` does, and compared with ``--predict --device cuda``'s numbers for it (the CUDA-aware
  prediction: the caching allocator simulated, CUDA's kernels' own allocations and the cuBLAS workspaces
  modelled). The baseline (parameters and inputs, allocated before the first iteration) must
  equal the predicted one; the allocated peak above it, less the cuBLAS workspace the warm-up
  left (``workspace_bytes``, shown), must be within :data:`PEAK_TOLERANCE` of the predicted
  peak above its baseline less the predicted workspace; reserved bytes (both with the workspaces'
  segments) within :data:`RESERVED_TOLERANCE` of the measured. These are the prediction's
  stated accuracy on CUDA (docs/CONTRACTS.md), so a machine measured correctly passes.
"""

from __future__ import annotations

from topk_bench.case import Budget
from topk_bench.child.execute import measure
from topk_bench.doctor import tiny
from topk_bench.doctor.check import Check, Result, brief, compile_failure
from topk_bench.results import columns as col
from topk_bench.status import Status
from topk_bench.types import DeviceKind, Method
from topk_bench.units import MIB

# The CUDA prediction's stated accuracy: the peak above the baseline within 1 MiB, the reserved peak within 5%
# of the measured.
PEAK_TOLERANCE = 1 * MIB
RESERVED_TOLERANCE = 0.05


def _pair(name: str, device: str, plugins: tuple[str, ...]):
    measured_case = tiny.case(name, device=device, repeats=1, plugins=plugins)
    predicted = measure(tiny.case(name, device=device, method=Method.PREDICTED, plugins=plugins), Budget())
    if DeviceKind.of(device) is DeviceKind.CPU:
        measured = measure(measured_case, Budget())
    else:
        from topk_bench.run.launcher import run_isolated  # a fresh allocator per case, as run does

        measured = run_isolated(measured_case, Budget())
    return measured, predicted


def check(name: str, device: str, plugins: tuple[str, ...] = ()) -> Check:
    label = f"peak = predicted: {name}"
    try:
        measured, predicted = _pair(name, device, plugins)
    except Exception as exc:  # noqa: BLE001 -- whatever fails is a failed check, not a crash
        return Check(label, Result.FAIL, f"raised {type(exc).__name__}: {brief(exc, 160)}")
    if measured.status != Status.OK:
        refused = compile_failure(measured.error)
        if refused:
            return Check(label, Result.SKIPPED, f"compile failed: {refused}")
        return Check(label, Result.FAIL, f"measured: {measured.status}: {measured.error}")
    above_measured = measured.peak_bytes - measured.baseline_bytes
    above_predicted = predicted.peak_bytes - predicted.baseline_bytes
    if DeviceKind.of(device) is DeviceKind.CPU:
        passed = (measured.peak_bytes, measured.baseline_bytes) == (predicted.peak_bytes, predicted.baseline_bytes)
        return Check.judged(
            label,
            passed,
            f"measured {measured.peak_bytes:,} B (baseline {measured.baseline_bytes:,}), "
            f"predicted {predicted.peak_bytes:,} B (baseline {predicted.baseline_bytes:,})",
        )
    workspace = measured.extra.get(col.WORKSPACE_BYTES)
    if workspace is None:
        return Check(label, Result.FAIL, "measured on CUDA without workspace_bytes")
    above_measured -= workspace  # the workspace stays allocated through the timed iterations
    above_predicted -= predicted.extra.get(col.WORKSPACE_BYTES) or 0  # as predicted (docs/predicting.md)
    passed = (
        abs(above_measured - above_predicted) <= PEAK_TOLERANCE
        and measured.baseline_bytes == predicted.baseline_bytes
        and workspace >= 0
    )
    detail = (
        f"allocated above baseline, less the workspace: measured {above_measured:,} B, predicted "
        f"{above_predicted:,} B (tolerance {PEAK_TOLERANCE // MIB} MiB); baseline measured "
        f"{measured.baseline_bytes:,} B, predicted {predicted.baseline_bytes:,} B; workspace {workspace:,} B"
    )
    if predicted.reserved_bytes is not None and measured.reserved_bytes is not None:
        off = measured.reserved_bytes - predicted.reserved_bytes  # both with the workspaces' segments
        passed &= abs(off) <= RESERVED_TOLERANCE * measured.reserved_bytes
        detail += (
            f"; reserved measured {measured.reserved_bytes:,} B, predicted {predicted.reserved_bytes:,} B "
            f"(tolerance {RESERVED_TOLERANCE:.0%})"
        )
    else:
        detail += f"; reserved {measured.reserved_bytes:,} B (no reserved prediction to compare)"
    return Check.judged(label, passed, detail)


def checks(device: str, plugins: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[Check]:
    """``plugins``: the modules that register plug-in implementations (a CUDA child imports them again);
    ``skip``: implementations judged elsewhere (a plug-in's, in a process of its own)."""
    return [check(impl.name, device, plugins) for impl in tiny.measured() if impl.predictable and impl.name not in skip]
