"""Measured peak bytes against the prediction (``--predict``), per predictable implementation and dtype.

Dtypes: float32 always; bfloat16 and float16 where the device multiplies their matrices natively
(:func:`topk_bench.attention.shared.hardware.multiplies_natively`: CUDA; a CPU with AVX-512 BF16 or AMX for bfloat16,
AMX-FP16 for float16), the dtypes a user benchmarks there. A dtype the CPU only emulates is one row, skipped,
saying why; a half dtype an implementation does not support (``unsupported``, measured and predicted) is skipped.

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

import torch

from topk_bench.attention.shared import hardware
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
FULL = "float32"
HALF = ("bfloat16", "float16")
# What a CPU needs to multiply a half dtype's matrices natively (:mod:`topk_bench.attention.shared.hardware`).
_NATIVE_ON_CPU = {"bfloat16": "AVX-512 BF16 or AMX", "float16": "AMX-FP16"}


def dtypes(device: str) -> tuple[list[str], dict[str, str]]:
    """The dtypes whose peaks are checked on ``device``, and why each other one is not."""
    kind = DeviceKind.of(device)
    native = [d for d in HALF if hardware.multiplies_natively(getattr(torch, d), kind.value)]
    capability = torch.backends.cpu.get_cpu_capability()
    skipped = {
        d: f"this CPU emulates {d} matrix products (torch's CPU capability {capability}, without {_NATIVE_ON_CPU[d]})"
        for d in HALF
        if d not in native
    }
    return [FULL, *native], skipped


def _pair(name: str, device: str, plugins: tuple[str, ...], dtype: str):
    measured_case = tiny.case(name, device=device, dtype=dtype, repeats=1, plugins=plugins)
    predicted = measure(tiny.case(name, device=device, dtype=dtype, method=Method.PREDICTED, plugins=plugins), Budget())
    if DeviceKind.of(device) is DeviceKind.CPU:
        measured = measure(measured_case, Budget())
    else:
        from topk_bench.run.launcher import run_isolated  # a fresh allocator per case, as run does

        measured = run_isolated(measured_case, Budget())
    return measured, predicted


def check(name: str, device: str, plugins: tuple[str, ...] = (), dtype: str = FULL) -> Check:
    label = f"peak = predicted: {name}" + ("" if dtype == FULL else f" ({dtype})")
    try:
        measured, predicted = _pair(name, device, plugins, dtype)
    except Exception as exc:  # noqa: BLE001 -- whatever fails is a failed check, not a crash
        return Check(label, Result.FAIL, f"raised {type(exc).__name__}: {brief(exc, 160)}")
    if dtype != FULL and measured.status == predicted.status == Status.UNSUPPORTED:
        return Check(label, Result.SKIPPED, f"{name} does not run {dtype}: {brief(measured.error, 160)}")
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


def checks_of(name: str, device: str, plugins: tuple[str, ...] = ()) -> list[Check]:
    """``name``'s peak checks, one per dtype of :func:`dtypes`."""
    return [check(name, device, plugins, dtype) for dtype in dtypes(device)[0]]


def skipped_dtypes(device: str) -> list[Check]:
    """One skipped row per dtype not checked on ``device``, saying why and which were."""
    checked, skipped = dtypes(device)
    return [
        Check(f"peak = predicted: {dtype}", Result.SKIPPED, f"{why}; checked: {', '.join(checked)}")
        for dtype, why in skipped.items()
    ]


def checks(device: str, plugins: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[Check]:
    """``plugins``: the modules that register plug-in implementations (a CUDA child imports them again);
    ``skip``: implementations judged elsewhere (a plug-in's, in a process of its own)."""
    judged = [impl.name for impl in tiny.measured() if impl.predictable and impl.name not in skip]
    return [c for name in judged for c in checks_of(name, device, plugins)] + skipped_dtypes(device)
