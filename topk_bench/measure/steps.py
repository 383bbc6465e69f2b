"""A case's workload built and one iteration of it run: what measuring (:mod:`.backends`) and predicting
(:mod:`topk_bench.predict`) share, with the result every backend returns.

An iteration is the paper's: forward, ``loss = out.mean()``, backward. Mode
``fwd`` runs the forward under ``torch.no_grad()`` (the paper's chunk-size figure
is forward only: no activations are kept for backward). Gradients of the
previous iteration are dropped before each one, so each starts from the same
live set: parameters, inputs and kept tensors, reported as ``baseline_bytes``.
A measured case whose last iteration left a NaN or inf (in the output, or a
gradient) keeps its numbers with status ``nonfinite``: fast garbage is no result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from topk_bench import workloads
from topk_bench.case import Case, Measurement
from topk_bench.errors import Unsupported
from topk_bench.measure import metadata, slowdown
from topk_bench.measure.compiled import compile_attention
from topk_bench.measure.ops import OpCount
from topk_bench.results import columns as col
from topk_bench.status import Status
from topk_bench.workloads import Workload
from topk_bench.workloads.support import unsupported


def dtype_of(case: Case) -> torch.dtype:
    return case.dtype.to_torch()


def check_supported(case: Case, *, predict: bool) -> None:
    problem = unsupported(case, predict=predict)
    if problem:
        raise Unsupported(problem)


def build(case: Case, device) -> Workload:
    """The case's workload; for mode ``fwd`` nothing requires grad; ``compile = true``: its attention compiled
    (:mod:`.compiled`; the compilation itself happens at the first call).

    (``no_grad`` alone is not enough: FlopCounterMode's module tracker trips over
    views of parameters that require grad inside ``no_grad``.)
    """
    wl = workloads.build(case, device, dtype_of(case))
    if not case.mode.backward:
        for t in (*wl.model.parameters(), *wl.inputs):
            t.requires_grad_(False)
    if case.compile:
        compile_attention(wl.model, case.compile_mode)
    return wl


def grad_context(case: Case):
    return contextlib.nullcontext() if case.mode.backward else torch.no_grad()


def iteration(
    wl: Workload, case: Case, clock: Callable[[], float] | None = None, losses: list[torch.Tensor] | None = None
) -> tuple[float, float]:
    """One forward (+ backward); returns (forward, backward) seconds when given a clock.

    ``out`` stays alive through backward, as in a benchmark script that keeps it.
    ``losses`` receives the detached loss (one scalar), to be checked after the timed region.
    """
    wl.clear_grads()
    by = slowdown.factor(case.impl) if clock else 1.0  # tests only (measure/slowdown.py)
    with grad_context(case):
        t0 = clock() if clock else 0.0
        out = wl()
        loss = out.mean()
        t1 = slowdown.stretch(clock, t0, by) if clock else 0.0
        if case.mode.backward:
            loss.backward()
        t2 = slowdown.stretch(clock, t1, by) if clock else 0.0
    if losses is not None:
        losses.append(loss.detach())
    del out, loss
    return t1 - t0, t2 - t1


def nonfinite(wl: Workload, loss: torch.Tensor) -> str:
    """Why the last iteration's numbers are not finite ("" when they are): its output, seen through
    ``loss = out.mean()`` (NaN or inf as soon as one element is), or a gradient it left behind."""
    if not bool(torch.isfinite(loss)):
        return f"the output holds NaN or inf (its mean is {float(loss)})"
    grads = [(f"input {i}", x.grad) for i, x in enumerate(wl.inputs)]
    grads += [(f"parameter {name}", p.grad) for name, p in wl.model.named_parameters()]
    for what, grad in grads:
        if grad is not None and not bool(torch.isfinite(grad).all()):
            return f"the gradient of {what} holds NaN or inf"
    return ""


def checked(measurement: Measurement, problem: str) -> Measurement:
    if problem:
        measurement.status, measurement.error = Status.NONFINITE, problem
    return measurement


def ok_result(case: Case, **fields) -> Measurement:
    meta = metadata.collect(case.device)
    return Measurement(status=Status.OK, device_name=meta["device_name"], metadata=meta, **fields)


def ops_columns(counted: OpCount, cuda: bool = False) -> dict:
    """``ops_per_iter`` and ``sdpa_backend``; on CUDA (``cuda``) also ``kernel_launches``."""
    launches = {col.KERNEL_LAUNCHES: counted.launches} if cuda else {}
    return {col.OPS_PER_ITER: counted.ops, col.SDPA_BACKEND: counted.sdpa_backend, **launches}
