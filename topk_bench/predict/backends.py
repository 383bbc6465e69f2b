"""Peak memory of one case without running its compute: the case under ``FakeTensorMode``.

The tracker under ``FakeTensorMode`` on the CPU device (``meta`` would send SDPA down another
path): exact allocated bytes at any size, nothing allocated, FLOPs from ``FlopCounterMode``. For a
CUDA case the same run's allocations, with CUDA's kernels' own (:mod:`.kernels`), go through a
simulation of the caching allocator (:mod:`.allocator`), replayed as ``measure_cuda`` runs them
(:mod:`.simulated`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from topk_bench.attention.shared import hardware
from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import Unsupported
from topk_bench.measure.memory import LiveBytes
from topk_bench.measure.ops import OpCounter
from topk_bench.measure.stages import columns as stage_columns
from topk_bench.measure.stages import peaks_of
from topk_bench.measure.steps import build, check_supported, iteration, ok_result, ops_columns
from topk_bench.predict import kernels, timing
from topk_bench.predict.cpu_kernels import CpuKernelOutputs
from topk_bench.predict.simulated import SimulatedCudaSteps, simulate
from topk_bench.protocol import OURS
from topk_bench.results import columns as col
from topk_bench.types import DeviceKind
from topk_bench.workloads import Workload


class NotPredictable(Exception):
    """A case declared predictable read a tensor's values under FakeTensorMode."""


@contextlib.contextmanager
def _declared_predictable(case: Case):
    """A data-dependent op (``.item()``, ``nonzero``, a branch on a value) in a case declared predictable: the
    error says which declaration to change, not only torch's exception."""
    try:
        yield
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise NotPredictable(
            f"{case.impl} is registered with predictable=True, but reads a tensor's values, which --predict cannot "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc!r}); remove the .item() "
            "(nonzero, data-dependent branch), or register it with predictable=False: --predict then records "
            "its cases unsupported"
        ) from exc


def predict(case: Case, budget: Budget, tracker: LiveBytes | None = None, **cuda_seams) -> Measurement:
    """Peak bytes of ``case`` without allocating; on CUDA, through the caching allocator (:func:`predict_cuda`).

    One iteration: every iteration of either protocol starts from the same live set, so it has the same peak.
    ``tracker``: a fresh :class:`LiveBytes` that counts more (a profile's), for the CPU; ``cuda_seams``:
    :func:`predict_cuda`'s ``make_trace`` and ``make_steps`` (a profile's), for CUDA.
    """
    check_supported(case, predict=True)
    with _declared_predictable(case):
        return _predict_cuda_or_cpu(case, tracker, cuda_seams)


def _predict_cuda_or_cpu(case: Case, tracker: LiveBytes | None, cuda_seams: dict) -> Measurement:
    if case.device_kind is DeviceKind.CUDA:
        return predict_cuda(case, **cuda_seams)
    # The CPU kernels' outputs where the meta kernels size them otherwise, below every counting mode.
    fake, cpu_outputs = FakeTensorMode(), CpuKernelOutputs()
    with fake, cpu_outputs:
        wl = build(case, "cpu")
    tracker = tracker or LiveBytes()
    tracker.register(wl.model, wl.inputs, wl.kept)
    with (
        fake,
        cpu_outputs,
        FlopCounterMode(display=False) as flops,
        OpCounter() as ops,
        tracker,
        peaks_of(case, tracker) as meter,
    ):
        iteration(wl, case)
    result = ok_result(
        case, peak_bytes=tracker.peak_bytes, baseline_bytes=tracker.baseline_bytes, flops=flops.get_total_flops()
    )
    result.extra.update(ops_columns(ops.counted))
    result.extra.update(stage_columns(None, meter.peak_bytes if meter is not None else None))
    return result


def predict_cuda(
    case: Case,
    *,
    empty_cache: bool = True,
    make_trace: Callable[..., kernels.KernelTrace] = kernels.KernelTrace,
    make_steps: Callable[..., SimulatedCudaSteps] = SimulatedCudaSteps,
    make_costs: Callable[[], timing.KernelCosts] | None = timing.KernelCosts,
) -> Measurement:
    """``measure_cuda``'s numbers from the fake run's allocations replayed on the simulated allocator.

    The build's and two iterations' storages (the profiling one, under ``FlopCounterMode`` as ``CudaSteps`` runs
    it, and a plain one for the other iterations), in order, as CUDA's kernels allocate them on the case's GPU
    (:mod:`topk_bench.predict.kernels`: the composites that branch on the device take CUDA's branch, each
    kernel's own buffers are added, outputs CUDA sizes otherwise are resized, the cuBLAS workspaces allocated at
    their first use and kept), replayed step by step through the protocol's iterations
    (:mod:`topk_bench.predict.simulated`): warm-up, gradients cleared, ``empty_cache`` (``empty_cache=False``:
    a measurement without it), peaks reset, the timed iterations. As measured: ``baseline_bytes`` after the
    build, ``workspace_bytes`` what the warm-up left besides, ``peak_bytes`` and ``reserved_bytes`` of the timed
    iterations, workspaces included. The ops whose CUDA allocations are not modelled are named in the
    ``cuda_unmodeled_ops`` column. ``make_trace(gpu, adds)`` and ``make_steps``: the trace and the simulation's
    steps (a profile's name every block of the peak: :mod:`topk_bench.capture.capture`). ``make_costs``: what
    records the iteration's kernels for its time on the GPU (:mod:`topk_bench.predict.timing`:
    ``time_predicted_s`` and its parts); None: no time.
    """
    if case.protocol != OURS.name:  # the simulation replays our sequence (one build, warm-up, reset)
        raise Unsupported(
            f"--predict --device cuda simulates the iterations of protocol {OURS.name!r} only, "
            f"not those of {case.protocol!r} (a build per timed iteration, peaks never reset)"
        )
    gpu, adds = kernels.gpu(case.gpu_model), kernels.EngineAdds()
    fake = FakeTensorMode()
    trace = make_trace(gpu, adds)
    # The implementations run on fake CPU tensors but shape their temporaries for CUDA (decode's key tiles).
    with fake, kernels.CudaComposites(gpu, adds), trace, hardware.target("cuda"):
        wl = build(case, "cpu")
    setup = trace.take()
    costs = make_costs() if make_costs is not None else None
    profiled, flops, ops = _traced_iteration(wl, case, fake, trace, counted=True, costs=costs)  # as CudaSteps.profile
    plain, _, _ = _traced_iteration(wl, case, fake, trace, counted=False)  # as a warm-up and a timed one
    (body, loss) = plain
    sim = simulate(
        case,
        setup,
        body,
        loss=loss,
        profile=profiled,
        empty_cache=empty_cache,
        persistent=trace.persistent,
        make_steps=make_steps,
    )
    result = ok_result(
        case,
        peak_bytes=sim.peak_bytes,
        reserved_bytes=sim.reserved_bytes,
        baseline_bytes=sim.baseline_bytes,
        flops=flops,
    )
    result.device_name = gpu.name
    result.extra[col.WORKSPACE_BYTES] = sim.workspace_bytes
    result.extra[col.CUDA_UNMODELED_OPS] = ";".join(sorted(trace.unmodelled))
    # The fake run's ops are what the host dispatches on CUDA too; SDPA's backend there is chosen by CUDA's
    # rules (kernels), not the fake CPU run's: left empty.
    result.extra[col.OPS_PER_ITER] = ops.ops
    result.extra[col.KERNEL_LAUNCHES] = ops.launches
    if costs is not None:
        result.extra.update(timing.columns(timing.estimate(costs.kernels, gpu)))
    return result


def _traced_iteration(
    wl: Workload, case: Case, fake: FakeTensorMode, trace, *, counted: bool, costs: timing.KernelCosts | None = None
):
    """((events, loss serial), FLOPs or None, ops or None) of one fake iteration on CUDA's path, from the live set
    of the build (the previous iteration's gradients are dropped outside the trace); ``counted``: under
    ``FlopCounterMode`` and the op counter, as the profiling iteration runs; ``costs``: the op counter that also
    records the iteration's kernels (the time model)."""
    with fake:
        wl.clear_grads()
    trace.take()
    trace.begin_iteration(counted=counted)
    gpu = trace.gpu
    losses: list[torch.Tensor] = []
    flops, ops = (FlopCounterMode(display=False), costs or OpCounter()) if counted else (None, None)
    with (
        fake,
        kernels.CudaComposites(gpu, trace.adds),
        flops or contextlib.nullcontext(),
        ops or contextlib.nullcontext(),
        trace,
        hardware.target("cuda"),
    ):
        iteration(wl, case, losses=losses)
    events = trace.take()
    return (
        (events, trace.serial(losses[0])),
        flops.get_total_flops() if flops is not None else None,
        ops.counted if ops is not None else None,
    )
